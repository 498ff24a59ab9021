//! Regenerates the committed fuzz seed corpus (`fuzz/corpus/parse_frame`). Ignored by
//! default: `cargo test -p pmrxe-wire --test fuzz_corpus -- --ignored`.

use pmrxe_wire::{read_pcap, sample_frames};
use std::path::Path;

#[test]
#[ignore]
fn regenerate_fuzz_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_frame");
    std::fs::create_dir_all(&root).unwrap();
    for (i, f) in sample_frames(1).iter().enumerate() {
        std::fs::write(root.join(format!("sample-{i:03}")), f).unwrap();
    }
    let cap = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/roce-send-ack.pcap");
    for (i, r) in read_pcap(&cap).unwrap().iter().enumerate().take(24) {
        std::fs::write(root.join(format!("capture-{i:03}")), &r.data).unwrap();
    }
}
