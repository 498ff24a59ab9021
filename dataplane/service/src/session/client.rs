//! Session-level requests: Hello (the client page and the async-event fd), packet capture,
//! rdma_cm forwarding.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam::channel::bounded;
use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_abi::{ClientPage, ABI_VERSION, CLIENT_PAGE_LEN, CLIENT_PAGE_MAGIC};
use pmrxe_runtime::lcore::Cmd;
use pmrxe_runtime::shm::{EventFd, Segment};

use super::{err, Reply, Session};
use crate::access::Viewer;

impl Session {
    pub(super) fn hello(&mut self, abi_version: u32, program: String, pid: i32) -> Reply {
        let sh = self.shared.clone();
        if abi_version != ABI_VERSION {
            return (err(libc::EPROTONOSUPPORT, &format!("ABI version {abi_version}, service speaks {ABI_VERSION}")), vec![]);
        }
        if self.id != 0 {
            return (err(libc::EALREADY, "already said hello"), vec![]);
        }
        let page = match Segment::create("pmrxe-client", CLIENT_PAGE_LEN as usize) {
            Ok(p) => Arc::new(p),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: a fresh zeroed page-sized segment; ClientPage fits (const assert in abi).
        unsafe {
            let p = page.as_ptr() as *mut ClientPage;
            core::ptr::addr_of_mut!((*p).magic).write(CLIENT_PAGE_MAGIC);
            core::ptr::addr_of_mut!((*p).version).write(ABI_VERSION);
        }
        self.id = sh.handle();
        self.home = sh.next_home.fetch_add(1, Ordering::Relaxed) as usize;
        let events_fd = match EventFd::new() {
            Ok(e) => Arc::new(e),
            Err(e) => return (err(libc::EMFILE, &e.to_string()), vec![]),
        };
        let (etx, erx) = bounded(256);
        self.events = Some(erx);
        // Before the lcores see the page: a fault in this client's segments is blamed on it.
        super::fault::client_started(self.id, self.fd, &etx, &events_fd, &page, &sh.mem);
        for lc in &sh.lcores {
            let _ = lc.cmds.send(Cmd::AddClient { client: self.id, page: page.clone(), events: etx.clone(), events_fd: Some(events_fd.clone()) });
        }
        sh.clients.lock().unwrap_or_else(|e| e.into_inner()).insert(self.id, crate::stats::ClientInfo { id: self.id, pid, uid: self.uid, program });
        let fd = page.fd().as_raw_fd();
        let efd = events_fd.fd().as_raw_fd();
        self.events_fd = Some(events_fd);
        // The lcores hold the page from now on; `page` keeps the fd valid until the reply is sent.
        // Second fd: the async-event eventfd (the shim's `async_fd`).
        let resp = Response::Hello { abi_version: ABI_VERSION, client_id: self.id, devices: sh.devices.clone() };
        // Then one wake-up eventfd per lcore, by index: the shim signals one after a doorbell
        // whose row says the lcore sleeps (`idle.mode = "wait"`).
        let mut fds = vec![fd, efd];
        fds.extend(sh.lcores.iter().map(|l| l.waker.fd().as_raw_fd()));
        (resp, fds)
    }

    pub(super) fn capture(&mut self, count: u64, qpn: Option<u32>, fds: Vec<OwnedFd>) -> Reply {
        let sh = self.shared.clone();
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "capture needs an output fd"), vec![]) };
        // Frames carry payloads: a user other than root and the service's may capture only
        // the frames of a QP of their own (sent by it or addressed to it).
        if let Viewer::User(uid) = self.viewer {
            let Some(q) = qpn else {
                return (err(libc::EPERM, "capturing a whole port is for root: name one of your QPs with --qp"), vec![]);
            };
            if !self.qp_of_user(q, uid) {
                return (err(libc::EPERM, &format!("QP {q:#x} is not one of yours")), vec![]);
            }
        }
        match sh.capture.start(fd, count, qpn) {
            Ok(()) => (Response::Ok, vec![]),
            Err(e) => (err(libc::EBUSY, &e), vec![]),
        }
    }

    /// Does QP `qpn` belong to a client of user `uid`? (Asks the lcores who owns it.)
    fn qp_of_user(&self, qpn: u32, uid: u32) -> bool {
        let sh = &self.shared;
        let owner = sh.lcores.iter().find_map(|lc| {
            let qps = lc.call(|tx| Cmd::QpStats { done: tx }).unwrap_or_default();
            qps.into_iter().find(|(q, _, _)| *q == qpn).map(|(_, client, _)| client)
        });
        let clients = sh.clients.lock().unwrap_or_else(|e| e.into_inner());
        owner.and_then(|c| clients.get(&c)).is_some_and(|c| c.uid == uid)
    }

    /// rdma_cm (issue 14): the connection-manager thread (crate::cm) owns ids, channels and QP1;
    /// the reply of CmOpenChannel carries the client's end of the event socket.
    pub(super) fn cm(&mut self, req: Request) -> Reply {
        let sh = self.shared.clone();
        let Some(cm) = &sh.cm else { return (err(libc::EOPNOTSUPP, "rdma_cm is not available in this service"), vec![]) };
        let (resp, fd) = cm.request(self.id, req);
        let fds = fd.as_ref().map(|f| vec![f.as_raw_fd()]).unwrap_or_default();
        self.hold = fd;
        (resp, fds)
    }
}
