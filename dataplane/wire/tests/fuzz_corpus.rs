//! The committed fuzz seed corpus (`fuzz/corpus/parse_frame`) is exactly what the generator
//! makes from `sample_frames(1)` and the reference capture, and every seed parses with a valid
//! ICRC (a seed corpus of rejected frames would only exercise the first length check).
//! Regenerate with `PMRXE_REGEN_CORPUS=1 cargo test -p pmrxe-wire --test fuzz_corpus`.

use pmrxe_wire::{parse_frame, read_pcap, sample_frames};
use std::path::Path;

fn expected() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = sample_frames(1).into_iter().enumerate().map(|(i, f)| (format!("sample-{i:03}"), f)).collect();
    let cap = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/roce-send-ack.pcap");
    for (i, r) in read_pcap(&cap).unwrap().into_iter().enumerate().take(24) {
        v.push((format!("capture-{i:03}"), r.data));
    }
    v
}

#[test]
fn fuzz_seed_corpus_is_current_and_every_seed_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_frame");
    let want = expected();
    if std::env::var_os("PMRXE_REGEN_CORPUS").is_some() {
        std::fs::create_dir_all(&root).unwrap();
        for (name, bytes) in &want {
            std::fs::write(root.join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in &want {
        let got = std::fs::read(root.join(name)).unwrap_or_else(|e| panic!("seed {name} missing ({e}); regenerate the corpus"));
        assert_eq!(&got, bytes, "seed {name} is stale; regenerate the corpus");
        // Capture frames with a non-4791 UDP port are not RoCE for our parser: only samples must parse.
        if name.starts_with("sample-") {
            parse_frame(bytes).unwrap_or_else(|e| panic!("seed {name} does not parse: {e:?}"));
        }
    }
}
