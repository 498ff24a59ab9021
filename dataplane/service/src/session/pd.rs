//! Protection domains.

use pmrxe_abi::ctrl::Response;

use pmrxe_config::LimitKind;

use super::{err, Reply, Session};
use crate::limits::Obj;

impl Session {
    pub(super) fn alloc_pd(&mut self, device: u32) -> Reply {
        let sh = self.shared.clone();
        if device as usize >= sh.devices.len() {
            return (err(libc::ENODEV, "no such device"), vec![]);
        }
        let r = match self.reserve(Obj::Kind(LimitKind::Pd), device) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let pd = sh.handle();
        self.objs.pds.insert(pd, device);
        self.commit(r, pd.into());
        (Response::Pd { pd }, vec![])
    }

    pub(super) fn dealloc_pd(&mut self, pd: u32) -> Reply {
        let busy = self.objs.mrs.values().chain(self.objs.mws.values()).any(|&p| p == pd);
        if busy {
            return (err(libc::EBUSY, "PD still has MRs/MWs"), vec![]);
        }
        match self.objs.pds.remove(&pd) {
            Some(_) => {
                self.release(Obj::Kind(LimitKind::Pd), pd.into());
                (Response::Ok, vec![])
            }
            None => (err(libc::EINVAL, "no such PD"), vec![]),
        }
    }
}
