//! Test helpers: run tshark and read its fields.
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
/// frame, or `None` (after printing why) if tshark is not installed.
pub fn tshark_fields(path: &Path, extra: &[&str], fields: &[&str]) -> Option<Vec<HashMap<String, String>>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path).args(["--disable-heuristic", "rpcrdma_infiniband"]).args(extra);
    cmd.args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: tshark not available ({e})");
            return None;
        }
    };
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .map(|l| {
                let v: Vec<&str> = l.split('\t').collect();
                fields.iter().enumerate().map(|(i, f)| (f.to_string(), v.get(i).unwrap_or(&"").to_string())).collect()
            })
            .collect(),
    )
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
