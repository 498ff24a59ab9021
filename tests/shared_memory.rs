//! Registering memory that is already shareable (issue 13 item 7), against the real service:
//! hugetlbfs (SysV `SHM_HUGETLB`, hugetlb memfds), memfds, SysV SHM, `MAP_SHARED` files and
//! shared anonymous memory are handed to the service as they are (same file, same pages, huge
//! pages stay huge in the service), and private `MAP_HUGETLB` memory registers at any
//! alignment.
//!
//! `tests/shared_mr.c` (compiled here with cc against libibverbs, run through the shim)
//! registers an unaligned part of one kind of memory and RDMA-WRITEs into it from a second QP;
//! it checks the bytes through a second view of the same file. This test checks that the
//! service maps that very file (device and inode from the program's /proc/self/maps) with the
//! expected page size in /proc/<service>/smaps.
mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Reserves 2 MiB huge pages (`vm.nr_hugepages`) and puts the old value back on drop.
struct Hugepages {
    prev: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl Hugepages {
    /// Make at least `free` huge pages free (the kernel may give fewer: asserted).
    fn reserve(free: u64) -> Hugepages {
        let prev: u64 = std::fs::read_to_string(NR_HUGEPAGES).unwrap().trim().parse().unwrap();
        let in_use = prev.saturating_sub(hugepages_free());
        std::fs::write(NR_HUGEPAGES, (in_use + free).to_string()).expect("write nr_hugepages");
        let h = Hugepages { prev };
        assert!(hugepages_free() >= free, "the kernel reserved only {} free 2 MiB pages of {free}", hugepages_free());
        h
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.prev.to_string());
    }
}

/// The mappings of `pid` (smaps) as (header line, KernelPageSize in kB).
fn smaps(pid: u32) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in text.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.split('-').all(|h| u64::from_str_radix(h, 16).is_ok()) {
            out.push((l.to_string(), 0));
        } else if let Some(v) = l.strip_prefix("KernelPageSize:") {
            if let Some(last) = out.last_mut() {
                last.1 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    out
}

/// Mappings of `pid` of the file `dev`/`ino`.
fn maps_of_file(pid: u32, dev: &str, ino: &str) -> Vec<(String, u64)> {
    smaps(pid)
        .into_iter()
        .filter(|(h, _)| {
            let f: Vec<&str> = h.split_whitespace().collect();
            f.len() >= 5 && f[3] == dev && f[4] == ino
        })
        .collect()
}

fn build_prog(dir: &Path) -> PathBuf {
    let cc = require_tool("cc");
    let out = dir.join("shared_mr");
    let src = repo_root().join("tests/shared_mr.c");
    let o = Command::new(cc).arg("-O1").arg("-Wall").arg("-o").arg(&out).arg(&src).arg("-libverbs").output().unwrap();
    assert!(o.status.success(), "cc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
    out
}

/// Run `shared_mr KIND` under the shim; while it holds the registration, check the service
/// maps the same file with pages of `page_kb` (None: no mapping check).
fn check_kind(svc: &Service, prog: &Path, kind: &str, page_kb: Option<u64>) {
    let err = svc.dir.join(&format!("shared_mr.{kind}.err"));
    let mut child = svc
        .pmrxe()
        .arg("run")
        .arg("--")
        .arg(prog)
        .arg(kind)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != 3 || fields[0] != "MAPPED" {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{kind}: program failed before MAPPED ({line:?}):\n{}", read_to_string_lossy(&err));
    }
    let (dev, ino) = (fields[1], fields[2]);
    let seen = maps_of_file(svc.pid, dev, ino);
    // Let the program deregister and exit before asserting (no stray process on failure).
    drop(child.stdin.take());
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
    let st = wait_timeout(&mut child, Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "{kind}: exit {st:?}; stderr:\n{}", read_to_string_lossy(&err));
    assert!(rest.contains(&format!("OK {kind}")), "{kind}: {rest}");
    let Some(page_kb) = page_kb else { return };
    assert!(!seen.is_empty(), "{kind}: the service does not map the application's file {dev} {ino}; service smaps:\n{:#?}", smaps(svc.pid));
    assert!(seen.iter().all(|(h, kb)| *kb == page_kb && h.split_whitespace().nth(1).is_some_and(|p| p.ends_with('s'))), "{kind}: {seen:#?}");
    eprintln!("{kind}: service maps {dev} {ino} shared with {page_kb} kB pages: {}", seen[0].0);
    // Deregistration released the service's mapping of the file.
    let t0 = Instant::now();
    while !maps_of_file(svc.pid, dev, ino).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{kind}: the service still maps {dev} {ino} after the program exited");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// memfd, SysV SHM, a MAP_SHARED file and shared anonymous memory: registered without a copy.
#[test]
fn shared_memory_registers_as_is() {
    require_root();
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = build_prog(svc.dir.path());
    for kind in ["memfd", "sysv", "file", "anon_shared"] {
        check_kind(&svc, &prog, kind, Some(4));
    }
}

/// Shared memory cannot be sealed: a client that shrinks its registered memfd and then makes
/// the service write there (RDMA WRITE from another QP) must not kill the service (SIGBUS in
/// the lcore); the first packet lands in scratch pages, the service revokes the MR (issue 37:
/// the rest of the WRITE may be NAKed with a remote access error) and keeps serving.
#[test]
fn shrunk_shared_file_does_not_kill_the_service() {
    require_root();
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = build_prog(svc.dir.path());
    // Every page the WRITE touched was replaced by a scratch page: nothing of the file is left
    // to see in the service's maps.
    check_kind(&svc, &prog, "memfd_shrunk", None);
    let o = svc.pmrxe().arg("stats").output().unwrap();
    assert!(o.status.success(), "the service died after a client shrank a registered file:\n{}", tail(&svc.log_text(), 15));
    check_kind(&svc, &prog, "memfd", Some(4));
}

/// Huge pages: hugetlb memfds and SysV SHM_HUGETLB as they are, private MAP_HUGETLB memory
/// remapped in whole huge pages; the service's mapping is hugepage-backed in every case. Then
/// unmodified perftest with `--use_hugepages` at default sizes, the acceptance of item 7.
#[test]
fn hugepage_memory_registers_and_stays_huge() {
    require_root();
    let _l = heavy_lock();
    // shared_mr: 2 pages per region (+1 for the memfd's file offset, +2 for the anonymous
    // copy); perftest: a few per side. The service itself runs without hugepages.
    let _h = Hugepages::reserve(16);
    let svc = Service::start_loopback();
    let prog = build_prog(svc.dir.path());
    for kind in ["memfd_huge", "sysv_huge", "anon_huge"] {
        check_kind(&svc, &prog, kind, Some(2048));
    }

    let port = port_for(80);
    let p = port.to_string();
    let so = svc.dir.join("hp.server.out");
    let co = svc.dir.join("hp.client.out");
    let mut server = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-p", &p, "--use_hugepages", "-D", "3"], &so);
    wait_listening(&mut server, port, &so, Duration::from_secs(30));
    let mut client =
        spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-p", &p, "--use_hugepages", "-D", "3", "127.0.0.1"], &co);
    // While they run: the service maps perftest's SysV SHM_HUGETLB buffers with 2 MiB pages.
    let t0 = Instant::now();
    let mut huge_sysv = Vec::new();
    while huge_sysv.len() < 2 && t0.elapsed() < Duration::from_secs(20) && client.try_wait().unwrap().is_none() {
        huge_sysv = smaps(svc.pid).into_iter().filter(|(h, kb)| h.contains("/SYSV") && *kb == 2048).collect();
        std::thread::sleep(Duration::from_millis(20));
    }
    let cs = wait_timeout(&mut client, Duration::from_secs(60));
    let ss = wait_timeout(&mut server, Duration::from_secs(20));
    let out = PairOutput {
        server: ProgOutput { cmdline: "ib_write_bw server --use_hugepages".into(), status: ss, output: read_to_string_lossy(&so) },
        client: ProgOutput { cmdline: "ib_write_bw client --use_hugepages".into(), status: cs, output: read_to_string_lossy(&co) },
    };
    out.assert_ok();
    let rows = perftest_rows(&out.client.output);
    assert!(rows.iter().any(|r| r.len() >= 4 && r[0] == 65536.0 && r[3] > 0.0), "no 64 KiB bandwidth row:\n{}", out.client.output);
    assert!(huge_sysv.len() >= 2, "the service never mapped both perftest buffers with 2 MiB pages: {huge_sysv:#?}\nsmaps: {:#?}", smaps(svc.pid));
    eprintln!("ib_write_bw --use_hugepages: {:?}; service mappings: {huge_sysv:#?}", rows.last());
    let _ = std::io::stderr().flush();
}
