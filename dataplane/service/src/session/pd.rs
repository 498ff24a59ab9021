//! Protection domains.

use pmrxe_abi::ctrl::Response;

use super::{err, Reply, Session};

impl Session {
    pub(super) fn alloc_pd(&mut self, device: u32) -> Reply {
        let sh = self.shared.clone();
        if device as usize >= sh.devices.len() {
            return (err(libc::ENODEV, "no such device"), vec![]);
        }
        let pd = sh.handle();
        self.objs.pds.insert(pd, device);
        (Response::Pd { pd }, vec![])
    }

    pub(super) fn dealloc_pd(&mut self, pd: u32) -> Reply {
        let busy = self.objs.mrs.values().chain(self.objs.mws.values()).any(|&p| p == pd);
        if busy {
            return (err(libc::EBUSY, "PD still has MRs/MWs"), vec![]);
        }
        match self.objs.pds.remove(&pd) {
            Some(_) => (Response::Ok, vec![]),
            None => (err(libc::EINVAL, "no such PD"), vec![]),
        }
    }
}
