//! Who may use the service, and what each client may see: the admission half of the security
//! model (docs/operations.md, "Security model"). The kernel's uverbs is the model: access to
//! the device is a file permission (here the control socket's group), and what a process may
//! do beyond its own objects is a capability (here CAP_NET_RAW for privileged Q_Keys, root for
//! whole-port capture and every client's statistics).
use std::io;
use std::os::fd::AsRawFd;

use pmrxe_abi::ctrl;

/// The admission policy, fixed at start.
#[derive(Clone, Debug)]
pub struct Access {
    /// The service's own uid (admitted, and an administrator like root).
    pub service_uid: u32,
    /// The configured group's name.
    pub group_name: String,
    /// Its gid, if the host has such a group (without it only root and the service user are
    /// admitted).
    pub group: Option<u32>,
}

/// What the kernel says about a connected peer (`SO_PEERCRED`, `SO_PEERGROUPS`): credentials
/// as of its `connect`, which a later `setuid` in the client cannot change.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its pid (0 when it lives in a pid namespace we cannot see).
    pub pid: i32,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// CAP_NET_RAW's bit in a capability set.
const CAP_NET_RAW: u32 = 13;

impl Peer {
    /// The credentials of the process at the other end of `sock`.
    pub fn of(sock: &impl AsRawFd) -> io::Result<Peer> {
        let (pid, uid, gid) = ctrl::peer_cred(sock)?;
        let groups = ctrl::peer_groups(sock)?;
        Ok(Peer { pid, uid, gid, groups })
    }

    /// Whether the peer holds CAP_NET_RAW in its effective set (what the kernel asks of a
    /// process that gives a QP a privileged Q_Key). Read from `/proc/PID/status`; a peer we
    /// cannot see (another pid namespace) has it only if it is root. A capability counts only
    /// in the service's own user namespace, like the kernel's `capable()`, which checks the
    /// initial one: the root of a rootless container (`unshare --user --map-root-user`,
    /// podman) has every capability in its `CapEff` but is an ordinary user to us.
    pub fn net_raw(&self) -> bool {
        if self.pid <= 0 {
            return self.uid == 0;
        }
        if !same_user_namespace(self.pid) {
            return false;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else { return false };
        cap_eff_has(&status, CAP_NET_RAW)
    }
}

/// Whether process `pid` lives in our user namespace (its `/proc/PID/ns/user` is ours); false
/// when it cannot be told (the process is gone, or we may not look).
fn same_user_namespace(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    match (ns(&format!("/proc/{pid}/ns/user")), ns("/proc/self/ns/user")) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => false,
    }
}

/// Whether the `CapEff:` line of a `/proc/PID/status` text has capability `cap`.
fn cap_eff_has(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|set| set & (1u64 << cap) != 0)
}

impl Access {
    /// The policy for a service running as `service_uid` that admits group `group_name`.
    pub fn new(service_uid: u32, group_name: &str) -> Access {
        Access { service_uid, group_name: group_name.to_string(), group: ctrl::group_gid(group_name) }
    }

    /// Admit `p` (root, the service's user, or a member of the group), or say why not in the
    /// words the client will print.
    pub fn admit(&self, p: &Peer) -> Result<(), String> {
        if self.is_admin(p.uid) {
            return Ok(());
        }
        match self.group {
            Some(g) if p.gid == g || p.groups.contains(&g) => Ok(()),
            Some(_) => Err(format!(
                "permission denied (uid {} is not in group {}): ask the operator to add you (usermod -aG {} USER, then log in again)",
                p.uid, self.group_name, self.group_name
            )),
            None => Err(format!(
                "permission denied (uid {}): this host has no group {}, so only root and the service's user may use pmrxe",
                p.uid, self.group_name
            )),
        }
    }

    /// Sees every client's objects in `pmrxe stats` and may capture whole ports.
    pub fn is_admin(&self, uid: u32) -> bool {
        uid == 0 || uid == self.service_uid
    }
}

/// Who is asking for statistics: an administrator sees everything, anyone else only the
/// clients (and their QPs) of their own uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Root or the service's user.
    Admin,
    /// Another admitted user.
    User(u32),
}

impl Viewer {
    /// May this viewer see a client of user `uid`?
    pub fn sees(self, uid: u32) -> bool {
        match self {
            Viewer::Admin => true,
            Viewer::User(me) => me == uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer { pid: 0, uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn admission_by_uid_and_group() {
        let a = Access { service_uid: 990, group_name: "pmrxe".into(), group: Some(977) };
        assert!(a.admit(&peer(0, 0, &[])).is_ok(), "root");
        assert!(a.admit(&peer(990, 990, &[])).is_ok(), "the service's own user");
        assert!(a.admit(&peer(1000, 977, &[])).is_ok(), "primary group");
        assert!(a.admit(&peer(1000, 1000, &[4, 977])).is_ok(), "supplementary group");
        let e = a.admit(&peer(1001, 1001, &[4, 27])).unwrap_err();
        assert!(e.contains("not in group pmrxe"), "{e}");
        let none = Access { group: None, ..a };
        assert!(none.admit(&peer(1000, 977, &[977])).is_err(), "no such group on this host: nobody else");
        assert!(none.admit(&peer(0, 0, &[])).is_ok());
    }

    #[test]
    fn cap_net_raw_from_proc_status() {
        assert!(cap_eff_has("Name:\tx\nCapEff:\t000001ffffffffff\n", CAP_NET_RAW));
        assert!(!cap_eff_has("CapEff:\t0000000000000000\n", CAP_NET_RAW));
        assert!(cap_eff_has("CapEff:\t0000000000002000\n", CAP_NET_RAW));
        assert!(!cap_eff_has("CapPrm:\t0000000000002000\n", CAP_NET_RAW), "only the effective set counts");
    }

    #[test]
    fn viewers_see_their_own_uid_only() {
        assert!(Viewer::Admin.sees(5));
        assert!(Viewer::User(5).sees(5));
        assert!(!Viewer::User(5).sees(6));
    }
}
