//! `pmrxe bench --suite quick --json F` runs against its own spawned service and writes JSON
//! with every expected key. Not a performance test: it checks that the harness works and that
//! each figure is a positive number (the figures themselves go to docs/benchmarks.md).
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

fn positive(v: &serde_json::Value, key: &str, ctx: &str) {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{ctx}: `{key}` missing or not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{ctx}: `{key}` = {x}, expected > 0");
}

#[test]
fn quick_suite_writes_json_with_expected_keys() {
    let _lock = common::heavy_lock();
    let dir = std::env::temp_dir().join(format!("pmrxe-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let t0 = Instant::now();
    let out = Command::new(common::pmrxe_bin())
        .args(["bench", "--suite", "quick", "--duration", "0.1", "--iters", "500", "--json"])
        .arg(&json)
        .env_remove("PMRXE_SOCKET")
        .output()
        .expect("run pmrxe bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pmrxe bench failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(t0.elapsed() < Duration::from_secs(120), "the quick suite took {:?}", t0.elapsed());
    for heading in ["message rate", "bandwidth", "latency", "many QPs"] {
        assert!(stdout.contains(heading), "table lacks `{heading}`:\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("valid JSON");
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(v["schema"], 1);
    assert_eq!(v["suite"], "quick");
    assert!(v["machine"]["cpus"].as_u64().unwrap_or(0) >= 1, "machine facts: {}", v["machine"]);
    assert_eq!(v["service"]["spawned"], true);
    assert_eq!(v["service"]["path_mtu"], 4096);

    let rate = v["msg_rate"].as_array().expect("msg_rate array");
    for (op, size) in [("SEND", 8), ("SEND", 64), ("WRITE", 8), ("WRITE", 64)] {
        let r = rate.iter().find(|r| r["op"] == op && r["size"] == size).unwrap_or_else(|| panic!("msg_rate lacks {op} {size}"));
        positive(r, "mops", &format!("msg_rate {op} {size}"));
    }
    let bw = v["bandwidth"].as_array().expect("bandwidth array");
    for op in ["WRITE", "READ", "SEND"] {
        for size in [4096, 65536, 1 << 20] {
            let r = bw.iter().find(|r| r["op"] == op && r["size"] == size).unwrap_or_else(|| panic!("bandwidth lacks {op} {size}"));
            positive(r, "gb_per_s", &format!("bandwidth {op} {size}"));
        }
    }
    // 64 KiB WRITEs over 1, 16 and 64 QPs at once, each QP with its own memory: every
    // completion's status is checked by the harness; the ratio to 1 QP is reported.
    let many = v["many_qps"].as_array().expect("many_qps array");
    for q in [1, 16, 64] {
        let r = many.iter().find(|r| r["qps"] == q).unwrap_or_else(|| panic!("many_qps lacks {q} QPs: {many:?}"));
        positive(r, "gb_per_s", &format!("many_qps {q}"));
        positive(r, "vs_one_qp", &format!("many_qps {q}"));
        assert_eq!(r["size"], 65536);
    }
    let lat = v["latency"].as_array().expect("latency array");
    for op in ["WRITE", "SEND"] {
        let r = lat.iter().find(|r| r["op"] == op && r["size"] == 8).unwrap_or_else(|| panic!("latency lacks {op} 8"));
        for k in ["min_us", "p50_us", "p99_us", "p999_us", "mean_us"] {
            positive(r, k, &format!("latency {op}"));
        }
        assert!(r["p50_us"].as_f64() <= r["p99_us"].as_f64() && r["p99_us"].as_f64() <= r["p999_us"].as_f64(), "percentiles out of order: {r}");
    }
}

#[test]
fn memcpy_limit_needs_no_service() {
    let dir = std::env::temp_dir().join(format!("pmrxe-bench-memcpy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("memcpy.json");
    let out = Command::new(common::pmrxe_bin())
        .args(["bench", "--memcpy", "--sizes", "4K,64K", "--duration", "0.05", "--json"])
        .arg(&json)
        .output()
        .expect("run pmrxe bench --memcpy");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let m = v["memcpy"].as_array().expect("memcpy array");
    assert_eq!(m.len(), 2);
    for r in m {
        positive(r, "gb_per_s", "memcpy");
    }
}
