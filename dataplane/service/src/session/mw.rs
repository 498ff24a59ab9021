//! Memory windows.

use pmrxe_abi::ctrl::Response;
use pmrxe_mem::{Key, MwType};

use pmrxe_config::LimitKind;

use super::{err, Reply, Session};
use crate::limits::Obj;

impl Session {
    pub(super) fn alloc_mw(&mut self, pd: u32, mw_type: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(&dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        let t = match mw_type {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return (err(libc::EINVAL, "MW type must be 1 or 2"), vec![]),
        };
        let r = match self.reserve(Obj::Kind(LimitKind::Mw), dev) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        match sh.mem.alloc_mw(pd, t) {
            Ok(k) => {
                self.objs.mws.insert(k.0, pd);
                self.commit(r, k.0.into());
                (Response::Mw { key: k.0 }, vec![])
            }
            Err(e) => (err(libc::ENOMEM, &e.to_string()), vec![]),
        }
    }

    pub(super) fn dealloc_mw(&mut self, key: u32) -> Reply {
        let sh = self.shared.clone();
        if self.objs.mws.remove(&key).is_none() {
            return (err(libc::EINVAL, "no such MW"), vec![]);
        }
        self.release(Obj::Kind(LimitKind::Mw), key.into());
        match sh.mem.dealloc_mw(Key(key)) {
            Ok(()) => (Response::Ok, vec![]),
            Err(e) => (err(libc::EBUSY, &e.to_string()), vec![]),
        }
    }
}
