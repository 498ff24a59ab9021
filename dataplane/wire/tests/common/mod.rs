//! Test helpers: run tshark and read its fields; run the project's independent ICRC checker.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A unique scratch path under the system temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pmrxe-wire-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Run `tshark -T fields` with `fields` (first occurrence of each) and return one map per
/// frame. A missing tshark fails the test (scripts/setup.sh installs Debian's `tshark`).
pub fn tshark_fields(path: &Path, extra: &[&str], fields: &[&str]) -> Vec<HashMap<String, String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path).args(["--disable-heuristic", "rpcrdma_infiniband"]).args(extra);
    cmd.args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run tshark ({e}): install Debian's `tshark` package (scripts/setup.sh does)"),
    };
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| {
            let v: Vec<&str> = l.split('\t').collect();
            fields.iter().enumerate().map(|(i, f)| (f.to_string(), v.get(i).unwrap_or(&"").to_string())).collect()
        })
        .collect()
}

/// Parse a tshark number: decimal, or 0x-hex.
pub fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parse tshark FT_BYTES shown as plain hex (immdt, ieth) into a big-endian u32.
pub fn bytes32(s: &str) -> Option<u32> {
    if s.is_empty() {
        None
    } else {
        Some(u32::from_str_radix(&s.replace(':', ""), 16).unwrap())
    }
}

/// Parse "True"/"False"/"1"/"0".
pub fn flag(s: &str) -> bool {
    matches!(s, "1" | "True" | "true")
}

/// Run the project's own ICRC and header checker (`scripts/lib/icrc_check.py`, Python standard
/// library only, independent of this crate) on `pcap` with `args`; returns (success, stdout).
/// A missing python3 fails the test (Debian's `python3`, installed by scripts/setup.sh).
pub fn icrc_check(pcap: &Path, args: &[&str]) -> (bool, String) {
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/icrc_check.py");
    assert!(checker.is_file(), "the ICRC checker {} is missing from the repository", checker.display());
    let out = Command::new("python3")
        .arg(&checker)
        .args(args)
        .arg(pcap)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): install Debian's `python3` package (scripts/setup.sh does)"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}
