//! Issue 37, "client memory can never fault the service", against the real service with real
//! programs through the shim (tests/sec_hugetlb_punch.c):
//!
//! * `hugetlb_punch_hole_attack_costs_only_the_attackers_mr`: a client registers a sealed
//!   hugetlb memfd, punches a hole in it, takes every free huge page and makes the lcore touch
//!   the hole with a SEND gather and with a loopback RDMA WRITE scatter. Before issue 37 the
//!   lcore died of SIGBUS (exit 135) and every client got DEVICE_FATAL. Proven here: the
//!   service stays up, `pmrxe stats` answers within a second, a bystander ibv_rc_pingpong pair
//!   running meanwhile completes, the attacker's MR is revoked (async event 0x2001 naming its
//!   key; the next SEND from it completes LOC_PROT_ERR, the next WRITE into it
//!   REM_ACCESS_ERR, the QP is in ERROR), the revoked MR still deregisters, and the log stays
//!   bounded.
//! * `shared_mapping_of_a_disk_file_is_refused_at_registration`: `ibv_reg_mr` of a
//!   `MAP_SHARED` mapping of a file on a disk filesystem fails with EFAULT and a message naming
//!   the filesystem (the kernel refuses a long-term pin of such a mapping since 6.5); a FUSE or
//!   NFS file takes the same path (only tmpfs/shmem and hugetlbfs pass the `fstatfs` check).
//!   FUSE itself is not exercised: serving a FUSE filesystem needs a FUSE server (libfuse or
//!   a hand-written /dev/fuse protocol loop), which this machine does not have.
//!
//! Huge pages are reserved for the first test through `vm.nr_hugepages` and the previous value
//! is put back when it ends; the test fails (never skips) if the kernel will not give them.
mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Makes `free` 2 MiB huge pages free (`vm.nr_hugepages`) and puts the old value back on drop.
struct Hugepages {
    prev: u64,
}

impl Hugepages {
    fn reserve(free: u64) -> Hugepages {
        let prev: u64 = std::fs::read_to_string(NR_HUGEPAGES).unwrap().trim().parse().unwrap();
        let h = Hugepages { prev };
        let in_use = prev.saturating_sub(hugepages_free());
        std::fs::write(NR_HUGEPAGES, (in_use + free).to_string()).unwrap_or_else(|e| panic!("cannot reserve huge pages ({NR_HUGEPAGES}): {e}"));
        assert!(hugepages_free() >= free, "the kernel reserved only {} free 2 MiB pages of {free}: this test needs them", hugepages_free());
        h
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.prev.to_string());
    }
}

fn build(svc: &Service) -> std::path::PathBuf {
    let prog = svc.dir.join("sec_hugetlb_punch");
    compile_c("tests/sec_hugetlb_punch.c", &prog, &require_tool("cc"), &["-libverbs"]);
    prog
}

fn assert_alive(svc: &mut Service, what: &str) {
    let st = svc.child.as_mut().expect("service child").try_wait().unwrap();
    assert!(st.is_none(), "the service died ({st:?}) {what}; log:\n{}", tail(&svc.log_text(), 30));
}

#[test]
fn hugetlb_punch_hole_attack_costs_only_the_attackers_mr() {
    require_root();
    let _l = heavy_lock();
    let mut svc = Service::start_loopback();
    let prog = build(&svc);
    let p = prog.to_str().unwrap();
    for (i, mode) in ["send", "write"].into_iter().enumerate() {
        let bystander = Bystander::start(&svc, port_for(230 + i as u16), 3000);
        // The program's memfd takes two huge pages; the rest is what the attacker grabs.
        let pool = Hugepages::reserve(4);
        let o = run_verbs(&svc, &[p, mode], T);
        drop(pool);
        assert_alive(&mut svc, &format!("after the {mode} attack"));
        assert!(o.ok(), "{mode}: {}\nservice log:\n{}", o.describe(), tail(&svc.log_text(), 20));
        let out = &o.output;
        assert!(out.contains("FREE 0"), "{mode}: the attacker did not take every free huge page:\n{out}");
        assert!(out.contains("EVENT 0x2001"), "{mode}: no MR-revoked event:\n{out}");
        assert!(out.contains(&format!("OK {mode}")), "{mode}: {out}");
        eprintln!("{mode}: {}", out.lines().filter(|l| l.starts_with("FIRST") || l.starts_with("SECOND") || l.starts_with("EVENT")).collect::<Vec<_>>().join(" | "));
        bystander.check(&svc, T, 200);
        let log = svc.log_text();
        assert!(log.contains("MR revoked"), "{mode}: the service did not report the revocation:\n{}", tail(&log, 20));
    }
    // Two attacks, two revocations, each warned about once.
    let log = svc.log_text();
    assert_eq!(log.matches("MR revoked").count(), 2, "{}", tail(&log, 20));
    // ... and counted where an operator looks.
    let j = svc.stats_json();
    assert_eq!(j["memory_faults"]["revoked_mrs"].as_u64(), Some(2), "{}", j["memory_faults"]);
    assert!(j["memory_faults"]["rescued"].as_u64().unwrap_or(0) >= 2, "{}", j["memory_faults"]);
    assert!(svc.stats_text().contains("client memory faults: rescued"), "no stats line for the faults");
    assert_alive(&mut svc, "at the end");
}

/// `statfs.f_type` of `dir`.
fn fs_magic(dir: &Path) -> u32 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain C data, filled by statfs.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0, "statfs {}", dir.display());
    s.f_type as u32
}

#[test]
fn shared_mapping_of_a_disk_file_is_refused_at_registration() {
    require_root();
    let _l = heavy_lock();
    let mut svc = Service::start_loopback();
    let prog = build(&svc);
    // A directory on a disk filesystem: the service's temporary directory, else the
    // repository's target directory.
    const MEMORY_FS: [u32; 3] = [0x0102_1994, 0x9584_58f6, 0x8584_58f6];
    let dir = [svc.dir.path().to_path_buf(), repo_root().join("target")]
        .into_iter()
        .find(|d| !MEMORY_FS.contains(&fs_magic(d)))
        .expect("neither the temporary directory nor target/ is on a disk filesystem: cannot test the refusal here");
    let magic = fs_magic(&dir);
    let file = dir.join(format!("sec-disk-mr-{}", std::process::id()));
    let o = run_verbs(&svc, &[prog.to_str().unwrap(), "disk", file.to_str().unwrap()], T);
    let _ = std::fs::remove_file(&file);
    assert!(o.ok(), "{}", o.describe());
    assert!(o.output.contains(&format!("REFUSED errno={}", libc::EFAULT)), "not refused with EFAULT:\n{}", o.output);
    let why = format!("filesystem magic {magic:#x}");
    assert!(o.output.contains("cannot register") && o.output.contains(&why), "the shim's message does not name the filesystem ({why}):\n{}", o.output);
    assert!(o.output.contains("OK disk"), "{}", o.output);
    assert_alive(&mut svc, "after the refused registration");
    let t0 = std::time::Instant::now();
    svc.stats_text();
    assert!(t0.elapsed() < Duration::from_secs(1));
}
