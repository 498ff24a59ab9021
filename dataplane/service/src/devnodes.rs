//! `/dev/infiniband/<dev_name>` placeholders for the devices this service serves.
//!
//! UCX (1.13) lists a verbs device only if `/dev/infiniband/<ibv_device.dev_name>` exists as a
//! read/write character device (`uct_ib_device_is_accessible`); it never opens it (everything
//! else goes through libibverbs, i.e. the shim). The shim reports `dev_name` =
//! [`pmrxe_abi::ctrl::dev_node_name`] (`pmrxe_uverbs<index>`, never a kernel `uverbsN` name), and
//! the service makes that path a symbolic link to `/dev/null` while it runs: a character device
//! every user may read and write, which carries no capability (the control socket's mode is
//! what grants access to pmrxe).
//!
//! Lifetime: created at start-up when absent, removed at a clean stop. Several services on one
//! host (netns topologies, private test services) share the same names, so the links are
//! reference-counted with a shared `flock` on `/dev/infiniband/.pmrxe-nodes.lock`: every
//! service holds it shared while it runs; at stop it drops its lock and removes the links only
//! if it can then take it exclusively (no other pmrxe service is running). A crashed service's
//! lock is released by the kernel; its stale links are harmless (the shim lists no device
//! without a service) and are adopted by the next start. Only symbolic links to `/dev/null` are
//! ever removed, so a real `/dev/infiniband` node is never touched.
//!
//! Creating them needs write access to `/dev` (root, as the systemd unit runs the service).
//! Without it the service logs one warning and serves anyway; UCX then does not see the devices.
use std::fs::File;
use rustix::fs::FlockOperation;
use std::path::{Path, PathBuf};

const DIR: &str = "/dev/infiniband";
const TARGET: &str = "/dev/null";
const LOCK: &str = ".pmrxe-nodes.lock";

/// The links of one service; dropping it releases them (see the module doc).
#[derive(Debug)]
pub struct DevNodes {
    dir: PathBuf,
    names: Vec<String>,
    lock: Option<File>,
}

impl DevNodes {
    /// Create (or adopt) `/dev/infiniband/pmrxe_uverbs<i>` for `0..count`.
    pub fn create(count: usize) -> DevNodes {
        Self::create_in(Path::new(DIR), count)
    }

    /// As [`DevNodes::create`], in another directory (tests).
    pub fn create_in(dir: &Path, count: usize) -> DevNodes {
        let names: Vec<String> = (0..count as u32).map(pmrxe_abi::ctrl::dev_node_name).collect();
        let mut nodes = DevNodes { dir: dir.to_path_buf(), names: Vec::new(), lock: None };
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::warn!("cannot create {}: {e}; UCX will not list the pmrxe devices", dir.display());
            return nodes;
        }
        match File::options().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK)) {
            Ok(f) => {
                if flock(&f, FlockOperation::LockShared).is_ok() {
                    nodes.lock = Some(f);
                }
            }
            Err(e) => {
                tracing::warn!("cannot create {}: {e}; UCX will not list the pmrxe devices", dir.join(LOCK).display());
                return nodes;
            }
        }
        for n in names {
            let p = dir.join(&n);
            if is_ours(&p) {
                nodes.names.push(n);
                continue;
            }
            match std::os::unix::fs::symlink(TARGET, &p) {
                Ok(()) => nodes.names.push(n),
                // Something else (a real device node?) has that name: leave it alone.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    tracing::warn!("{} exists and is not a pmrxe link; left as it is", p.display())
                }
                Err(e) => tracing::warn!("cannot create {}: {e}; UCX will not list this device", p.display()),
            }
        }
        nodes
    }

    /// The paths this service created or adopted.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.names.iter().map(|n| self.dir.join(n)).collect()
    }
}

impl Drop for DevNodes {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        // Drop our shared lock, then see whether anybody else still holds one.
        let _ = flock(&lock, FlockOperation::Unlock);
        if flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
            return; // another pmrxe service runs: it still needs the links
        }
        for p in self.paths() {
            if is_ours(&p) {
                let _ = std::fs::remove_file(&p);
            }
        }
        // Released when `lock` closes.
    }
}

/// A symbolic link to `/dev/null` (what [`DevNodes`] creates).
fn is_ours(p: &Path) -> bool {
    std::fs::read_link(p).is_ok_and(|t| t == Path::new(TARGET))
}

fn flock(f: &File, op: FlockOperation) -> std::io::Result<()> {
    loop {
        match rustix::fs::flock(f, op) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pmrxe-devnodes-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn created_as_char_devices_and_removed_by_the_last_service() {
        use std::os::unix::fs::FileTypeExt;
        let d = tmpdir("refcount");
        let a = DevNodes::create_in(&d, 2);
        assert_eq!(a.paths(), vec![d.join("pmrxe_uverbs0"), d.join("pmrxe_uverbs1")]);
        for p in a.paths() {
            assert!(std::fs::metadata(&p).unwrap().file_type().is_char_device(), "{}", p.display());
        }
        // A second service adopts them; the first one stopping leaves them for it.
        let b = DevNodes::create_in(&d, 1);
        assert_eq!(b.paths(), vec![d.join("pmrxe_uverbs0")]);
        drop(a);
        assert!(is_ours(&d.join("pmrxe_uverbs0")));
        assert!(is_ours(&d.join("pmrxe_uverbs1")), "only the last service removes links");
        drop(b);
        assert!(!d.join("pmrxe_uverbs0").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn foreign_files_are_left_alone() {
        let d = tmpdir("foreign");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("pmrxe_uverbs0"), b"not ours").unwrap();
        let n = DevNodes::create_in(&d, 2);
        assert_eq!(n.paths(), vec![d.join("pmrxe_uverbs1")]);
        drop(n);
        assert_eq!(std::fs::read(d.join("pmrxe_uverbs0")).unwrap(), b"not ours");
        assert!(!d.join("pmrxe_uverbs1").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
