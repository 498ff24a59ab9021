//! `cargo run -p pmrxe-wire --example sample -- OUT.pcap [SEED]`: write the wire sample
//! (same as `pmrxe wire sample --out OUT.pcap`).
fn main() {
    let mut a = std::env::args().skip(1);
    let out = a.next().expect("usage: sample OUT.pcap [SEED]");
    let seed = a.next().map_or(1, |s| s.parse().expect("seed"));
    let n = pmrxe_wire::write_sample(std::path::Path::new(&out), seed).expect("write");
    println!("wrote {n} frames to {out}");
}
