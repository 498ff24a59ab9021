//! How pmrxe is deployed around unmodified programs (issue 40; docs/operations.md "Containers").
//!
//! * A rootless container (`scripts/container.sh`: its own user, mount, network and pid
//!   namespaces, an empty root holding only the image's /usr and /etc, the control socket's
//!   directory, the shim and the /dev/infiniband links) run by an unprivileged member of the
//!   service's group: ib_write_bw server and client inside it (perftest's TCP exchange on the
//!   container's own loopback), ib_write_bw -R and rping against a server on the host, data
//!   checked by rping -V; traffic counted by the host's service.
//! * Inside the container the host's root shows as the overflow uid: without
//!   PMRXE_SERVICE_USER=nobody the shim refuses the socket (its directory "belongs to uid
//!   65534"), which is what the documented line sets.
//! * The container's root has every capability in its own user namespace but is an ordinary
//!   user to the service: its UD QP cannot take a privileged Q_Key (EPERM), like the kernel's
//!   `capable(CAP_NET_RAW)`; root on the host still can.
//! * iSCSI over iSER, all in userspace: tgt's `tgtd` (iser driver, a LUN on a file) and
//!   libiscsi's initiator, both under `pmrxe run`: `iscsi-inq`, then two sessions of a 64 KiB
//!   WRITE(10) and two READ(10)s (tests/iser_check.py), every byte checked against the backing
//!   file; tgtd still answers after both (it waits on the CM and CQ channel fds with epoll).
//! * Slurm on one node: slurmctld, slurmd and a private munged with a config the test writes;
//!   `srun --mpi=pmix -n 2` of tests/mpi_pingpong.c, each rank under `pmrxe run` (Open MPI
//!   over UCX on pmrxe0), data checked by the program.
//!
//! * Two nodes (`TwoNodes`: two network namespaces, pmrxe's veth with a service in each, and a
//!   second veth with kernel IPv4 for the launchers' own TCP, as a cluster's management
//!   network): Open MPI's `mpirun --hostfile` starting the remote rank through an rsh agent
//!   that enters the other namespace, each rank on its own node's service (`PMRXE_SOCKET`
//!   from the node's environment); data checked by the program, frames counted by both
//!   services, beside the same job over Open MPI's TCP BTL on the management veth.
//! * Slurm on those two nodes: slurmctld, one slurmd per node (`-N nodeA`/`nodeB`, each in its
//!   node's network, mount and UTS namespaces), munge; `srun --mpi=pmix -N 2 -n 2` with each
//!   task's `PMRXE_SOCKET` from a TaskProlog; checked and counted as above.
//!
//! Users and groups are created for the test and removed when it ends (pass or fail); the
//! container's mounts live in its own mount namespace and vanish with it.
mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// `scripts/container.sh -- ARGS` as `user`, output to `out`; the container reaches `svc`.
fn spawn_container(svc: &Service, user: &str, env: &[(&str, &str)], args: &[&str], out: &Path) -> Child {
    for t in ["unshare", "chroot", "mount", "ip", "setpriv"] {
        require_tool(t);
    }
    let f = std::fs::File::create(out).unwrap();
    let mut c = Command::new(require_tool("setpriv"));
    c.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
        .arg(for_all_users().join("container.sh"))
        .arg("--socket-dir")
        .arg(svc.dir.path())
        .arg("--shim")
        .arg(for_all_users().join("libpmrxe_verbs.so"))
        .arg("--")
        .args(args)
        .env("HOME", "/tmp")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    c.spawn().unwrap_or_else(|e| panic!("spawn container.sh {args:?}: {e}"))
}

fn run_container(svc: &Service, user: &str, args: &[&str], tag: &str) -> ProgOutput {
    let out = svc.dir.join(&format!("ct-{tag}.out"));
    let mut c = spawn_container(svc, user, &[], args, &out);
    let status = wait_timeout(&mut c, T);
    ProgOutput { cmdline: format!("[container {user}] {}", args.join(" ")), status, output: read_to_string_lossy(&out) }
}

fn bw_rows(o: &ProgOutput) -> Vec<Vec<f64>> {
    let rows = perftest_rows(&o.output);
    assert!(o.ok() && !rows.is_empty() && rows[0][3] > 0.0, "{}", o.describe());
    rows
}

#[test]
fn a_rootless_container_runs_perftest_and_rping_against_the_hosts_service() {
    for t in ["ib_write_bw", "rping", "cc"] {
        require_tool(t);
    }
    let m = Member::create("c");
    let _l = heavy_lock();
    let cfg_dir = TempDir::new("deploy-cfg");
    let svc = Service::start(Some(&config_with_group(cfg_dir.path(), &m.group)), None);
    // The socket's directory: root's, not writable by others (what the shim demands); the
    // member reaches the socket through its group.
    std::fs::set_permissions(svc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let qkey = svc.dir.join("sec_qkey");
    compile_c("tests/sec_qkey.c", &qkey, &require_tool("cc"), &["-libverbs"]);
    let before = sum_counter(&svc.stats_json(), "tx_packets");

    // 1. Both perftest sides in the container: its TCP exchange runs on the container's own lo.
    let o = run_container(
        &svc,
        &m.user,
        &["sh", "-c", "ib_write_bw -d pmrxe0 -s 65536 -n 2000 & i=0; until grep -q ':4853 .* 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null || [ $i -ge 600 ]; do sleep 0.05; i=$((i+1)); done; timeout 60 ib_write_bw -d pmrxe1 -s 65536 -n 2000 localhost; rc=$?; wait; exit $rc"],
        "bw-inside",
    );
    let inside = bw_rows(&o)[0][3];

    // 2. Server on the host (as the same member), client in the container, connected by rdma_cm
    //    (-R): no TCP between the namespaces is needed.
    let hs = svc.dir.join("host-bw.out");
    let mut server = spawn_verbs_as(&svc.socket, Some(&m.user), &["ib_write_bw", "-R", "-d", "pmrxe0", "-s", "65536", "-n", "2000"], &hs);
    wait_until(Duration::from_secs(30), "host ib_write_bw -R listening", || cm_listeners(&svc) >= 1);
    let o = run_container(&svc, &m.user, &["timeout", "60", "ib_write_bw", "-R", "-d", "pmrxe1", "-s", "65536", "-n", "2000", "198.18.0.1"], "bw-cross");
    let cross = bw_rows(&o)[0][3];
    let st = wait_timeout(&mut server, T);
    assert!(st.is_some_and(|s| s.success()), "host ib_write_bw -R: {}", read_to_string_lossy(&hs));

    // 3. rping with its data check (-V), server on the host, client in the container.
    let rs = svc.dir.join("host-rping.out");
    let listeners = cm_listeners(&svc);
    let mut server = spawn_verbs_as(&svc.socket, Some(&m.user), &["rping", "-s", "-a", "198.18.0.1", "-C", "20", "-V"], &rs);
    wait_until(Duration::from_secs(30), "host rping listening", || cm_listeners(&svc) > listeners);
    let o = run_container(&svc, &m.user, &["timeout", "60", "rping", "-c", "-a", "198.18.0.1", "-C", "20", "-V"], "rping");
    assert!(o.ok(), "{}", o.describe());
    let st = wait_timeout(&mut server, T);
    assert!(st.is_some_and(|s| s.success()), "host rping -s: {}", read_to_string_lossy(&rs));

    // 4. The container's root is not privileged to the service.
    let o = run_container(&svc, &m.user, &["/run/pmrxe/sec_qkey"], "qkey");
    assert!(o.ok() && o.output.contains(&format!("modify_privileged errno {}", libc::EPERM)), "a rootless container's root set a privileged Q_Key: {}", o.describe());
    let r = run_verbs(&svc, &[qkey.to_str().unwrap()], Duration::from_secs(30));
    assert!(r.ok() && r.output.contains("modify_privileged errno 0"), "host root: {}", r.describe());

    // 5. Without PMRXE_SERVICE_USER=nobody the shim refuses the socket, saying why.
    let o = run_container(&svc, &m.user, &["env", "-u", "PMRXE_SERVICE_USER", "ibv_devices"], "untrusted");
    assert!(o.output.contains("belongs to uid 65534"), "{}", o.describe());

    let tx = sum_counter(&svc.stats_json(), "tx_packets") - before;
    assert!(tx > 2 * 2000, "the container's traffic did not go through the service: {tx} frames");
    eprintln!("container ib_write_bw 64 KiB: both sides inside {inside:.0} MB/s, host server/container client (-R) {cross:.0} MB/s; {tx} frames");
}

/// The same container across two hosts: services in two namespaces (configs/netns-{a,b}.toml
/// with `service.group`), an `ib_write_bw -R` server on host A as the member, and the client
/// in a rootless container reaching host B's service, then rping with its data check the same
/// way; every byte crosses the veth.
#[test]
fn a_rootless_container_on_host_b_reaches_a_server_on_host_a() {
    for t in ["ib_write_bw", "rping"] {
        require_tool(t);
    }
    let m = Member::create("n");
    let _l = heavy_lock();
    let ns = NetnsPair::up("ct");
    let dir = TempDir::new("deploy-netns-cfg");
    let start = |which: char, netns: &str| {
        let p = ns.config(&dir, which);
        let text = std::fs::read_to_string(&p).unwrap().replacen("[service]\n", &format!("[service]\ngroup = \"{}\"\n", m.group), 1);
        std::fs::write(&p, text).unwrap();
        let svc = Service::start(Some(&p), Some(netns));
        std::fs::set_permissions(svc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        svc
    };
    let (a, b) = (start('a', &ns.a), start('b', &ns.b));
    let before = sum_counter(&b.stats_json(), "tx_packets");
    let hs = a.dir.join("host-bw.out");
    let mut server = spawn_verbs_as(&a.socket, Some(&m.user), &["ib_write_bw", "-R", "-d", "pmrxe0", "-s", "65536", "-n", "1000"], &hs);
    wait_until(Duration::from_secs(30), "host A's ib_write_bw -R listening", || cm_listeners(&a) >= 1);
    let o = run_container(&b, &m.user, &["timeout", "60", "ib_write_bw", "-R", "-d", "pmrxe0", "-s", "65536", "-n", "1000", "10.77.0.1"], "bw-netns");
    let bw = bw_rows(&o)[0][3];
    let st = wait_timeout(&mut server, T);
    assert!(st.is_some_and(|s| s.success()), "host A ib_write_bw -R: {}", read_to_string_lossy(&hs));
    let rs = a.dir.join("host-rping.out");
    let listeners = cm_listeners(&a);
    let mut server = spawn_verbs_as(&a.socket, Some(&m.user), &["rping", "-s", "-a", "10.77.0.1", "-C", "20", "-V"], &rs);
    wait_until(Duration::from_secs(30), "host A's rping listening", || cm_listeners(&a) > listeners);
    let o = run_container(&b, &m.user, &["timeout", "60", "rping", "-c", "-a", "10.77.0.1", "-C", "20", "-V"], "rping-netns");
    assert!(o.ok(), "{}", o.describe());
    let st = wait_timeout(&mut server, T);
    assert!(st.is_some_and(|s| s.success()), "host A rping -s: {}", read_to_string_lossy(&rs));
    let tx = sum_counter(&b.stats_json(), "tx_packets") - before;
    assert!(tx > 1000, "the container's traffic did not leave host B's service: {tx} frames");
    eprintln!("container on host B, server on host A: ib_write_bw -R 64 KiB {bw:.0} MB/s; rping -V 20 checked; B sent {tx} frames");
}

/// tgtd under `pmrxe run`, stopped (SIGKILL: tgtd only leaves through `tgtadm --op delete
/// --mode system`) and its control socket removed on drop.
struct Tgtd {
    run: Child,
    port: u32,
}

impl Tgtd {
    fn tgtadm(&self, args: &[&str]) -> std::process::Output {
        let port = self.port.to_string();
        let mut c = Command::new(require_tool("tgtadm"));
        c.args(["-C", &port, "--lld", "iser"]).args(args).stdin(Stdio::null());
        c.output().unwrap()
    }
    fn must(&self, args: &[&str]) {
        let o = self.tgtadm(args);
        assert!(o.status.success(), "tgtadm {args:?}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let kids = read_to_string_lossy(Path::new(&format!("/proc/{}/task/{}/children", self.run.id(), self.run.id())));
        for pid in kids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: signalling a child of our own `pmrxe run`.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.run.kill();
        let _ = self.run.wait();
        for suffix in ["", ".lock"] {
            let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}{suffix}", self.port));
        }
    }
}

/// tgtd with the iSER driver under `pmrxe run` against `target` (a 64 MiB file-backed LUN), and
/// libiscsi's iSER initiator against `initiator` reaching it at `addr`: iscsi-inq, then two
/// sessions of a WRITE(10) and two READ(10)s checked against the backing file. Returns the
/// frames the two services moved.
fn iser_session(target: &Service, initiator_svc: &Service, addr: &str) -> u64 {
    let backing = target.dir.join("lun.img");
    std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
    let out = target.dir.join("tgtd.out");
    let port = 4000 + std::process::id() % 1000;
    let tgtd = Tgtd { run: spawn_verbs(target, &["tgtd", "-f", "-C", &port.to_string()], &out), port };
    // The iser driver is up once tgtadm can name it (it registers after its rdma_cm portals
    // listen: an IPv6 and an IPv4 wildcard on port 3260, both AF-only).
    wait_until(Duration::from_secs(20), "tgtd's iser driver answering tgtadm", || tgtd.tgtadm(&["--mode", "target", "--op", "show"]).status.success());
    assert!(!read_to_string_lossy(&out).contains("rdma_bind_addr"), "tgtd could not bind its portals:\n{}", read_to_string_lossy(&out));
    let iqn = "iqn.2026-12.pmrxe:disk1";
    let initiator = "iqn.2026-12.pmrxe:client";
    tgtd.must(&["--mode", "target", "--op", "new", "--tid", "1", "-T", iqn]);
    tgtd.must(&["--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "-b", backing.to_str().unwrap()]);
    tgtd.must(&["--mode", "target", "--op", "bind", "--tid", "1", "-I", "ALL"]);
    // tgt 1.0.85's iSER login wants the initiator in its name ACL too (its TCP login does not).
    tgtd.must(&["--mode", "target", "--op", "bind", "--tid", "1", "-Q", initiator]);
    let url = format!("iser://{addr}/{iqn}/1");
    // Frames sent on the wire, or looped back inside a device (target and initiator on one).
    let frames = |j: &serde_json::Value| sum_counter(j, "tx_packets") + sum_counter(j, "rx_loopback");
    let both = || frames(&target.stats_json()) + if std::ptr::eq(target, initiator_svc) { 0 } else { frames(&initiator_svc.stats_json()) };
    let before = both();

    let o = run_verbs(initiator_svc, &["iscsi-inq", "-i", initiator, &url], T);
    assert!(o.ok() && o.output.contains("VIRTUAL-DISK"), "{}\ntgtd:\n{}", o.describe(), tail(&read_to_string_lossy(&out), 20));
    // Two sessions, each a write and two reads checked against the backing file: tgt learns of
    // connections and completions only through epoll on the CM event channel's and the CQ
    // channel's fds, so both must be real and readable exactly when an event waits (a stale
    // wakeup once left tgtd blocked in ibv_get_cq_event after the first session).
    let check = repo_root().join("tests/iser_check.py");
    for round in 0..2 {
        let o = run_verbs(initiator_svc, &["python3", check.to_str().unwrap(), &url, initiator, backing.to_str().unwrap()], T);
        assert!(o.ok() && o.output.contains("OK iser_check"), "round {round}: {}\ntgtd:\n{}", o.describe(), tail(&read_to_string_lossy(&out), 20));
    }
    let t0 = std::time::Instant::now();
    assert!(tgtd.tgtadm(&["--mode", "target", "--op", "show"]).status.success() && t0.elapsed() < Duration::from_secs(5), "tgtd stopped answering");
    let tx = both() - before;
    assert!(tx > 100, "iSER traffic did not go through the service: {tx} frames");
    tx
}

#[test]
fn iser_block_io_through_tgt_and_libiscsi_with_data_checked() {
    for t in ["tgtd", "tgtadm", "iscsi-inq", "python3"] {
        require_tool(t);
    }
    require_root();
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    // Target and initiator share pmrxe0 (198.18.0.1): frames loop back inside the device.
    let tx = iser_session(&svc, &svc, "198.18.0.1");
    eprintln!("iSER: iscsi-inq and 2 x (64 KiB WRITE(10) + 2 x 64 KiB READ(10)) checked; {tx} frames");
}

/// The same between two services in two namespaces: tgtd's portal on A (10.77.0.1), the
/// initiator on B; every PDU and data transfer crosses the veth (af_packet, path MTU 1024).
#[test]
fn iser_block_io_between_two_namespaces() {
    for t in ["tgtd", "tgtadm", "iscsi-inq", "python3"] {
        require_tool(t);
    }
    let _l = heavy_lock();
    let ns = NetnsPair::up("is");
    let dir = TempDir::new("iser-netns");
    let (a, b) = ns.services(&dir);
    let rx_b0 = sum_counter(&b.stats_json(), "rx_bytes");
    let tx = iser_session(&a, &b, "10.77.0.1");
    let rx_b = sum_counter(&b.stats_json(), "rx_bytes") - rx_b0;
    // Four 64 KiB READ(10)s reached B over the veth, at least.
    assert!(rx_b >= 4 * 65536, "B received {rx_b} B");
    eprintln!("iSER across namespaces: iscsi-inq and 2 x (64 KiB WRITE(10) + 2 x 64 KiB READ(10)) checked; {tx} frames, B received {rx_b} B");
}

/// Daemons started in the foreground for one test, stopped on drop: SIGTERM first (slurmctld
/// and slurmd then reap their own helpers, slurmscriptd and slurmstepd, instead of leaving
/// them to init), SIGKILL after 5 s.
struct Daemons(Vec<Child>);

impl Daemons {
    /// Start `cmd` (which must exec the daemon itself, in the foreground), output to `log`.
    fn spawn(&mut self, cmd: &mut Command, log: &Path) {
        let f = std::fs::File::create(log).unwrap();
        self.0.push(cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}")));
    }

    /// A private munged (the installed key) with its socket, pid, log and seed in `dir`;
    /// returns the socket once it exists.
    fn munged(&mut self, dir: &Path) -> std::path::PathBuf {
        let sock = dir.join("munge.sock");
        self.spawn(
            Command::new(require_tool("munged"))
                .arg("-F")
                .arg("--force")
                .arg(format!("--socket={}", sock.display()))
                .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
                .arg(format!("--log-file={}", dir.join("munged.log").display()))
                .arg(format!("--seed-file={}", dir.join("munge.seed").display())),
            &dir.join("munged.out"),
        );
        wait_until(Duration::from_secs(10), "munged's socket", || sock.exists());
        sock
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            sigterm(c.id());
            if wait_timeout(c, Duration::from_secs(5)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Slurm on one node (slurmctld + slurmd, a private munged, a config the test writes) launches
/// an MPI program with `srun --mpi=pmix -n 2`, each rank under `pmrxe run` using pmrxe0 over
/// UCX; the ping-pong and allreduce data are checked by the program, the traffic counted by
/// the service. Two nodes: `slurm_two_nodes_in_two_namespaces_srun_pmix_through_each_nodes_service`.
#[test]
fn slurm_srun_pmix_runs_an_mpi_program_through_pmrxe() {
    for t in ["slurmctld", "slurmd", "srun", "munged", "mpicc"] {
        require_tool(t);
    }
    require_root();
    assert!(Path::new("/etc/munge/munge.key").exists(), "no /etc/munge/munge.key: the munge package creates it at install");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let dir = TempDir::new("slurm");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["state", "spool"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let prog = dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &require_tool("mpicc"), &[]);
    let mut daemons = Daemons(Vec::new());
    let sock = daemons.munged(dir.path());
    let mut spawn = |cmd: &mut Command, log: &str| daemons.spawn(cmd, &dir.join(log));
    let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout).unwrap().trim().to_string();
    let base = 20000 + (std::process::id() % 1000) * 2;
    let conf = dir.join("slurm.conf");
    let d = dir.path().display();
    std::fs::write(
        &conf,
        format!(
            "ClusterName=pmrxe\nSlurmctldHost={host}\nSlurmUser=root\nSlurmctldPort={base}\nSlurmdPort={}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/d.pid\n\
             AuthType=auth/munge\nAuthInfo=socket={}\nCredType=cred/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n\
             SlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             NodeName={host} CPUs={} State=UNKNOWN\nPartitionName=p Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            base + 1,
            sock.display(),
            std::thread::available_parallelism().map_or(2, |n| n.get()),
        ),
    )
    .unwrap();
    spawn(Command::new(require_tool("slurmctld")).args(["-D", "-c", "-f"]).arg(&conf), "ctld.out");
    spawn(Command::new(require_tool("slurmd")).args(["-D", "-f"]).arg(&conf), "slurmd.out");
    let sinfo = || Command::new(require_tool("sinfo")).args(["-h", "-o", "%t"]).env("SLURM_CONF", &conf).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    wait_until(Duration::from_secs(30), "the slurm node idle", || sinfo().is_ok_and(|s| s == "idle"));

    let before = svc.stats_json();
    let out = dir.join("srun.out");
    let f = std::fs::File::create(&out).unwrap();
    // srun's --export splits on commas: UCX_TLS (which has commas) travels in the environment.
    let mut c = Command::new(require_tool("srun"));
    c.args(["--mpi=pmix", "-n", "2", "--export=ALL"])
        .arg(pmrxe_bin())
        .args(["run", "--"])
        .arg(&prog)
        .env("SLURM_CONF", &conf)
        .env("PMRXE_SOCKET", &svc.socket)
        .env("UCX_TLS", "rc_verbs,ud_verbs:aux,self")
        .env("UCX_NET_DEVICES", "pmrxe0:1")
        .env("OMPI_MCA_pml", "ucx")
        .env("OMPI_MCA_btl", "self")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let mut child = c.spawn().unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(180));
    let text = read_to_string_lossy(&out);
    assert!(st.is_some_and(|s| s.success()) && text.contains("OK mpi") && text.contains("allreduce of 100000 doubles checked"), "srun: {st:?}\n{}", tail(&text, 30));
    let after = svc.stats_json();
    let (wqes, lb) = (sum_counter(&after, "sq_wqes") - sum_counter(&before, "sq_wqes"), sum_counter(&after, "rx_loopback") - sum_counter(&before, "rx_loopback"));
    assert!(wqes >= 1000 && lb >= 1000, "the MPI traffic did not go through pmrxe: sq_wqes {wqes} rx_loopback {lb}");
    eprintln!("slurm srun --mpi=pmix -n 2: {}", text.lines().filter(|l| l.starts_with("pingpong")).collect::<Vec<_>>().join("; "));
    drop(daemons);
}

/// Node addresses on the management veth (kernel IPv4; pmrxe's veth carries 10.77.0.x).
const MGMT_A: &str = "10.78.0.1";
const MGMT_B: &str = "10.78.0.2";

/// Two nodes on one machine: network namespaces `ns.a` and `ns.b` joined by pmrxe's veth
/// (scripts/netns.sh; service `a` on 10.77.0.1, `b` on 10.77.0.2) and by a second veth with
/// kernel addresses MGMT_A / MGMT_B, over which launchers (Open MPI's orted, slurmd, PMIx)
/// talk TCP as they would on a cluster's management network. Fields drop in order: the
/// services stop before the namespaces (and both veths) go.
struct TwoNodes {
    a: Service,
    b: Service,
    ns: NetnsPair,
    dir: TempDir,
}

impl TwoNodes {
    fn up(tag: &str) -> TwoNodes {
        let ns = NetnsPair::up(tag);
        let dir = TempDir::new(&format!("nodes-{tag}"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let id = std::process::id() % 100_000;
        let (ma, mb) = (format!("pxm{tag}{id}a"), format!("pxm{tag}{id}b"));
        // Created inside `a` with its peer in `b`: nothing is ever left in the root namespace.
        sh("ip", &["-n", &ns.a, "link", "add", &ma, "type", "veth", "peer", "name", &mb, "netns", &ns.b]);
        for (n, dev, ip) in [(&ns.a, &ma, MGMT_A), (&ns.b, &mb, MGMT_B)] {
            sh("ip", &["-n", n, "addr", "add", &format!("{ip}/24"), "dev", dev]);
            sh("ip", &["-n", n, "link", "set", dev, "up"]);
        }
        let (a, b) = ns.services(&dir);
        TwoNodes { a, b, ns, dir }
    }

    /// (namespace, service) of the node at management address `ip`.
    fn node(&self, ip: &str) -> (&str, &Service) {
        if ip == MGMT_A {
            (&self.ns.a, &self.a)
        } else {
            (&self.ns.b, &self.b)
        }
    }

    /// `tx_bytes` of each service's port.
    fn sent(&self) -> (u64, u64) {
        (sum_counter(&self.a.stats_json(), "tx_bytes"), sum_counter(&self.b.stats_json(), "tx_bytes"))
    }
}

/// tests/mpi_pingpong.c's rows: (1 B half round trip in us, 1 MiB MB/s).
fn mpi_figures(out: &str) -> (f64, f64) {
    let row = |size: &str| {
        let l = out.lines().find(|l| l.starts_with("pingpong") && l.contains(&format!(" {size} B:"))).unwrap_or_else(|| panic!("no {size} B row:\n{out}"));
        let w: Vec<&str> = l.split_whitespace().collect();
        (w[3].parse::<f64>().unwrap(), w[w.len() - 2].parse::<f64>().unwrap())
    };
    (row("1").0, row("1048576").1)
}

/// Ping-pong iterations per size in the two-node jobs: 20 x 1 MiB each way keeps a job within
/// seconds on a loaded 2-vCPU machine and is still 20 MiB on each node's port.
const NODE_ITERS: &str = "20";

/// `cmd` in its own process group with its output in `dir/name`, bounded by `limit` (then the
/// whole group is killed: mpirun's and srun's helpers too); returns (exit status, output).
fn run_logged(cmd: &mut Command, dir: &Path, name: &str, limit: Duration) -> (Option<std::process::ExitStatus>, String) {
    use std::os::unix::process::CommandExt;
    let out = dir.join(name);
    let f = std::fs::File::create(&out).unwrap();
    let mut c = cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f).process_group(0).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pgid = c.id() as i32;
    let st = wait_timeout(&mut c, limit);
    if st.is_none() {
        // SAFETY: signalling the process group this function created (the child is its leader).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    (st, read_to_string_lossy(&out))
}

/// Open MPI's `mpirun --hostfile` across two nodes: mpirun runs on node A (in its namespace,
/// with node A's `PMRXE_SOCKET`), rank 0 beside it; rank 1 is started on node B through
/// `--mca plm_rsh_agent`, a script the test writes that does what ssh would: enter node B
/// (`ip netns exec`) with node B's environment (its `PMRXE_SOCKET`) and run orted there. Each
/// rank runs `pmrxe run -- mpi_pingpong`, so it reaches its own node's service; orted, PMIx
/// and UCX's address exchange use the management veth. Data checked by the program; each
/// service must have sent the 1 MiB messages (a rank on the wrong service would loop back
/// inside one device and leave the other at 0). The same job over the TCP BTL on the
/// management veth gives the figure beside it.
/// `mpirun --hostfile` from node A over both nodes: the hostfile (one slot per node's
/// management address) and the `plm_rsh_agent` script that does what ssh would (enter the
/// node's namespace with its `PMRXE_SOCKET`).
struct Hostfile<'a> {
    n: &'a TwoNodes,
    hosts: std::path::PathBuf,
    agent: std::path::PathBuf,
}

impl<'a> Hostfile<'a> {
    fn new(n: &'a TwoNodes) -> Hostfile<'a> {
        let hosts = n.dir.join("hostfile");
        std::fs::write(&hosts, format!("{MGMT_A} slots=1\n{MGMT_B} slots=1\n")).unwrap();
        let agent = n.dir.join("netns-rsh");
        let node_case = |ip: &str| {
            let (ns, svc) = n.node(ip);
            format!("  {ip}) ns={ns} sock={} ;;\n", svc.socket.display())
        };
        std::fs::write(
            &agent,
            format!(
                "#!/bin/sh\n# Open MPI's rsh launcher runs: AGENT HOST COMMAND...; enter HOST's namespace with its environment.\n\
                 while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done\nhost=$1; shift\ncase $host in\n{}{}  *) echo \"netns-rsh: no node $host\" >&2; exit 1 ;;\nesac\n\
                 exec ip netns exec \"$ns\" env PMRXE_SOCKET=\"$sock\" sh -c \"$*\"\n",
                node_case(MGMT_A),
                node_case(MGMT_B)
            ),
        )
        .unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        Hostfile { n, hosts, agent }
    }

    /// `mpirun --hostfile -np 2 sh -c APP` started in node A with extra `mca` arguments (and
    /// `-x` exports); (exit status, output in `name`).
    fn mpirun(&self, mca: &[&str], app: &str, name: &str) -> (Option<std::process::ExitStatus>, String) {
        let mut c = Command::new(require_tool("ip"));
        c.args(["netns", "exec", &self.n.ns.a]).arg(require_tool("mpirun")).args(["--allow-run-as-root", "--hostfile"]).arg(&self.hosts);
        c.args(["--mca", "plm_rsh_agent"]).arg(&self.agent).args(["--mca", "oob_tcp_if_include", "10.78.0.0/24"]).args(mca);
        c.args(["-np", "2", "sh", "-c", app]).env("PMRXE_SOCKET", &self.n.a.socket);
        run_logged(&mut c, self.n.dir.path(), name, Duration::from_secs(180))
    }
}

/// Open MPI over UCX through each node's service, as the ping-pong job runs it.
const UCX_ON_EACH_NODE: [&str; 10] = ["--mca", "pml", "ucx", "--mca", "btl", "self", "-x", "UCX_TLS=rc_verbs,ud_verbs:aux,self", "-x", "UCX_NET_DEVICES=pmrxe0:1"];

#[test]
fn mpirun_hostfile_runs_one_rank_per_namespace_through_each_nodes_service() {
    let mpicc = require_tool("mpicc");
    require_tool("mpirun");
    require_tool("ip");
    let _l = heavy_lock();
    let n = TwoNodes::up("hf");
    let prog = n.dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &mpicc, &[]);
    let h = Hostfile::new(&n);
    let (a0, b0) = n.sent();
    let app = format!("echo \"rank $OMPI_COMM_WORLD_RANK netns $(ip netns identify $$)\"; exec {} run -- {} {NODE_ITERS}", pmrxe_bin().display(), prog.display());
    let (st, o) = h.mpirun(&UCX_ON_EACH_NODE, &app, "mpirun.out");
    assert!(st.is_some_and(|s| s.success()) && o.contains("OK mpi") && o.contains("allreduce of 100000 doubles checked"), "mpirun: {st:?}\n{}", tail(&o, 40));
    for (rank, ns) in [(0, &n.ns.a), (1, &n.ns.b)] {
        assert!(o.contains(&format!("rank {rank} netns {ns}\n")), "rank {rank} did not run in {ns}:\n{o}");
    }
    let (da, db) = n.sent();
    let (da, db) = (da - a0, db - b0);
    assert!(da >= 20 << 20 && db >= 20 << 20, "each rank must use its own node's service: A sent {da} B, B sent {db} B\n{o}");
    let (lat, bw) = mpi_figures(&o);
    let (st, t) = h.mpirun(&["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "10.78.0.0/24"], &format!("exec {} {NODE_ITERS}", prog.display()), "mpirun-tcp.out");
    assert!(st.is_some_and(|s| s.success()) && t.contains("OK mpi"), "mpirun over TCP: {st:?}\n{}", tail(&t, 40));
    let (tlat, tbw) = mpi_figures(&t);
    eprintln!("FIGURES Open MPI 4.1.4 mpirun --hostfile, two namespaces, UCX rc_verbs through each node's pmrxe: 1 B {lat:.1} us, 1 MiB {bw:.1} MB/s (A sent {da} B, B {db} B); ob1/tcp on the management veth: 1 B {tlat:.1} us, 1 MiB {tbw:.1} MB/s");
}

/// The Open MPI applications tests/applications.rs runs on the loopback config, across the two
/// nodes with `mpirun --hostfile` (one rank per node, each through its node's service): an
/// mpi4py script (every byte and the allreduce checked), and Open MPI's ob1 PML over its ofi BTL on
/// libfabric's `verbs;ofi_rxd` (mpi_pingpong's checks). Each service must have moved the job's
/// traffic. (The cm PML over the ofi MTL on `verbs;ofi_rxm` cannot connect between hosts:
/// docs/limits.md, "fi_pingpong between two hosts". HPC Challenge runs across the namespaces
/// under MPICH: tests/applications.rs.)
#[test]
fn mpi4py_and_btl_ofi_under_open_mpi_across_two_namespaces() {
    let mpicc = require_tool("mpicc");
    require_tool("mpirun");
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "/usr/bin/python3 missing (Debian python3, with python3-mpi4py)");
    let _l = heavy_lock();
    let n = TwoNodes::up("ap");
    let h = Hostfile::new(&n);
    let pmrxe = pmrxe_bin();
    let moved = |what: &str, min: u64, before: (u64, u64), o: &str| {
        let (da, db) = n.sent();
        let (da, db) = (da - before.0, db - before.1);
        assert!(da >= min && db >= min, "{what}: each node's service must carry its rank's traffic: A sent {da} B, B sent {db} B\n{}", tail(o, 30));
        (da, db)
    };

    // mpi4py (Debian's, built for Open MPI).
    let script = repo_root().join("tests/mpi4py_check.py");
    let before = n.sent();
    let app = format!("exec {} run -- {} {}", pmrxe.display(), python.display(), script.display());
    let (st, o) = h.mpirun(&UCX_ON_EACH_NODE, &app, "mpi4py.out");
    assert!(st.is_some_and(|s| s.success()) && o.contains("OK mpi4py Open MPI"), "mpi4py: {st:?}\n{}", tail(&o, 40));
    moved("mpi4py", 10 << 20, before, &o);

    // ob1 + btl ofi over libfabric's verbs provider with the rxd utility provider.
    let prog = n.dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &mpicc, &[]);
    let before = n.sent();
    let app = format!("exec {} run -- {} 20", pmrxe.display(), prog.display());
    let (st, o) = h.mpirun(&["--mca", "pml", "ob1", "--mca", "btl", "ofi,self", "--mca", "btl_ofi_mode", "2", "-x", "FI_PROVIDER=verbs;ofi_rxd"], &app, "btl-ofi.out");
    assert!(st.is_some_and(|s| s.success()) && o.contains("OK mpi") && o.contains("allreduce of 100000 doubles checked"), "btl ofi: {st:?}\n{}", tail(&o, 40));
    moved("btl ofi", 20 << 20, before, &o);
    let (lat, bw) = mpi_figures(&o);
    eprintln!(
        "FIGURES two namespaces, mpirun --hostfile: mpi4py OK; ob1 + btl ofi (verbs;ofi_rxd): 1 B {lat:.1} us, 1 MiB {bw:.1} MB/s"
    );
}

/// Slurm on two nodes, one per network namespace ([`TwoNodes`]): slurmctld and slurmd
/// `-N nodeA` in node A, slurmd `-N nodeB` in node B (NodeAddr = each node's management
/// address), one private munged, a config the test writes. Each daemon enters its node's
/// network namespace with `nsenter --net` (not `ip netns exec`, whose fresh /sys has no cgroup
/// mount and stops slurmd) and gets its own mount and UTS namespaces, in which the node's own
/// directories are bind-mounted on the configured SlurmdSpoolDir and TmpFS: two slurmds on one
/// machine would otherwise share the PMIx plugin's `stepd.slurm.pmix.J.S` socket and its
/// `spmix_appdir_*` directory. A TaskProlog gives each task its node's `PMRXE_SOCKET` (what a
/// cluster's TaskProlog does with the node's one socket path; srun's own is not exported).
/// `srun --mpi=pmix -N 2 -n 2` of tests/mpi_pingpong.c, every rank under `pmrxe run`: each
/// rank names its node, namespace and socket; data checked by the program; each service sends
/// the 1 MiB messages. The same job over Open MPI's TCP BTL on the management veth gives the
/// figure beside it.
#[test]
fn slurm_two_nodes_in_two_namespaces_srun_pmix_through_each_nodes_service() {
    for t in ["slurmctld", "slurmd", "srun", "sinfo", "munged", "mpicc", "nsenter", "unshare", "hostname", "mount"] {
        require_tool(t);
    }
    require_root();
    assert!(Path::new("/etc/munge/munge.key").exists(), "no /etc/munge/munge.key: the munge package creates it at install");
    let _l = heavy_lock();
    let n = TwoNodes::up("sl");
    let dir = n.dir.join("slurm");
    for d in ["state", "spool", "tmp", "nodeA/spool", "nodeA/tmp", "nodeB/spool", "nodeB/tmp"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let prog = n.dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &require_tool("mpicc"), &[]);
    let mut daemons = Daemons(Vec::new());
    let munge = daemons.munged(&dir);
    let d = dir.display();
    let prolog = dir.join("taskprolog");
    std::fs::write(
        &prolog,
        format!(
            "#!/bin/sh\ncase $SLURMD_NODENAME in\n  nodeA) echo \"export PMRXE_SOCKET={}\" ;;\n  nodeB) echo \"export PMRXE_SOCKET={}\" ;;\nesac\n",
            n.a.socket.display(),
            n.b.socket.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&prolog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.join("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "ClusterName=pmrxe2\nSlurmctldHost=nodeA({MGMT_A})\nSlurmUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nTmpFS={d}/tmp\nSlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/spool/slurmd.pid\n\
             AuthType=auth/munge\nAuthInfo=socket={}\nCredType=cred/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nTaskProlog={}\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n\
             SlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n\
             NodeName=nodeA NodeAddr={MGMT_A} CPUs=1 State=UNKNOWN\nNodeName=nodeB NodeAddr={MGMT_B} CPUs=1 State=UNKNOWN\n\
             PartitionName=p Nodes=nodeA,nodeB Default=YES MaxTime=INFINITE State=UP\n",
            munge.display(),
            prolog.display(),
        ),
    )
    .unwrap();
    // A daemon of `node`: its network namespace, then its own mount and UTS namespaces with the
    // node's directories in place and its host name set, then exec (the child's pid is the daemon's).
    let on_node = |node: &str, ns: &str, args: &[&str]| {
        let mut c = Command::new(require_tool("nsenter"));
        c.arg(format!("--net=/run/netns/{ns}")).args(["unshare", "--mount", "--uts", "sh", "-c"]);
        c.arg(format!("mount --bind {d}/{node}/spool {d}/spool && mount --bind {d}/{node}/tmp {d}/tmp && hostname {node} && exec \"$@\""));
        c.arg("sh").args(args);
        c
    };
    let conf_s = conf.to_str().unwrap();
    daemons.spawn(&mut on_node("nodeA", &n.ns.a, &["slurmctld", "-D", "-c", "-f", conf_s]), &dir.join("ctld.out"));
    daemons.spawn(&mut on_node("nodeA", &n.ns.a, &["slurmd", "-D", "-N", "nodeA", "-f", conf_s]), &dir.join("slurmd-a.out"));
    daemons.spawn(&mut on_node("nodeB", &n.ns.b, &["slurmd", "-D", "-N", "nodeB", "-f", conf_s]), &dir.join("slurmd-b.out"));
    // Clients run in node A's network namespace (where slurmctld listens), as a login node would.
    let on_a = |prog: &str| {
        let mut c = Command::new(require_tool("nsenter"));
        c.arg(format!("--net=/run/netns/{}", n.ns.a)).arg(require_tool(prog)).env("SLURM_CONF", &conf).env_remove("PMRXE_SOCKET");
        c
    };
    let sinfo = || on_a("sinfo").args(["-h", "-o", "%t"]).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let logs = || format!("ctld:\n{}\nslurmd-a:\n{}\nslurmd-b:\n{}", tail(&read_to_string_lossy(&dir.join("ctld.log")), 10), tail(&read_to_string_lossy(&dir.join("slurmd-nodeA.log")), 10), tail(&read_to_string_lossy(&dir.join("slurmd-nodeB.log")), 10));
    let idle = poll_until(Duration::from_secs(30), || sinfo().is_ok_and(|s| s == "idle"));
    assert!(idle, "both nodes idle: sinfo says {:?}\n{}", sinfo(), logs());

    let srun = |env: &[(&str, &str)], app: &str, name: &str| {
        let mut c = on_a("srun");
        c.args(["--mpi=pmix", "-N", "2", "-n", "2", "--export=ALL", "sh", "-c", app]).envs(env.iter().copied());
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        run_logged(&mut c, n.dir.path(), name, Duration::from_secs(120))
    };
    let (a0, b0) = n.sent();
    let app = format!(
        "echo \"rank $SLURM_PROCID node $SLURMD_NODENAME netns $(ip netns identify $$) socket $PMRXE_SOCKET\"; exec {} run -- {} {NODE_ITERS}",
        pmrxe_bin().display(),
        prog.display()
    );
    // srun's --export splits on commas: UCX_TLS (which has commas) travels in the environment.
    let ucx = [("UCX_TLS", "rc_verbs,ud_verbs:aux,self"), ("UCX_NET_DEVICES", "pmrxe0:1"), ("OMPI_MCA_pml", "ucx"), ("OMPI_MCA_btl", "self")];
    let (st, o) = srun(&ucx, &app, "srun.out");
    assert!(st.is_some_and(|s| s.success()) && o.contains("OK mpi") && o.contains("allreduce of 100000 doubles checked"), "srun: {st:?}\n{}\n{}", tail(&o, 80), logs());
    for (rank, node, ns, svc) in [(0, "nodeA", &n.ns.a, &n.a), (1, "nodeB", &n.ns.b, &n.b)] {
        let want = format!("rank {rank} node {node} netns {ns} socket {}\n", svc.socket.display());
        assert!(o.contains(&want), "wanted {want:?} in:\n{o}");
    }
    let (da, db) = n.sent();
    let (da, db) = (da - a0, db - b0);
    assert!(da >= 20 << 20 && db >= 20 << 20, "each rank must use its own node's service: A sent {da} B, B sent {db} B\n{o}");
    let (lat, bw) = mpi_figures(&o);
    let tcp = [("OMPI_MCA_pml", "ob1"), ("OMPI_MCA_btl", "tcp,self"), ("OMPI_MCA_btl_tcp_if_include", "10.78.0.0/24")];
    let (st, t) = srun(&tcp, &format!("exec {} {NODE_ITERS}", prog.display()), "srun-tcp.out");
    assert!(st.is_some_and(|s| s.success()) && t.contains("OK mpi"), "srun over TCP: {st:?}\n{}", tail(&t, 80));
    let (tlat, tbw) = mpi_figures(&t);
    eprintln!("FIGURES Slurm 22.05 srun --mpi=pmix -N 2 -n 2, two namespaces, Open MPI over UCX rc_verbs through each node's pmrxe: 1 B {lat:.1} us, 1 MiB {bw:.1} MB/s (A sent {da} B, B {db} B); ob1/tcp on the management veth: 1 B {tlat:.1} us, 1 MiB {tbw:.1} MB/s");
    drop(daemons);
}
