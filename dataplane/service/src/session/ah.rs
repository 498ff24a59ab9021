//! Address handles, kept on the lcore that serves the PD's device under (client, handle): a
//! UD post naming another client's handle finds nothing, and the lcore drops a client's AHs
//! when the client goes.

use pmrxe_abi::ctrl::{AhAttr, Response};
use pmrxe_config::LimitKind;
use pmrxe_runtime::lcore::Cmd;

use super::attr::to_av;
use super::{err, Reply, Session};
use crate::limits::Obj;

impl Session {
    pub(super) fn create_ah(&mut self, pd: u32, attr: AhAttr) -> Reply {
        let sh = self.shared.clone();
        let Some(&dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        let reservation = match self.reserve(Obj::Kind(LimitKind::Ah), dev) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let ah = sh.handle();
        let lc = sh.lcore_for(self.home, dev);
        let _ = sh.lcores[lc].cmds.send(Cmd::AddAh { client: self.id, ah, av: to_av(&attr) });
        self.objs.ahs.insert(ah, lc);
        self.commit(reservation, ah.into());
        (Response::Ah { ah }, vec![])
    }

    pub(super) fn destroy_ah(&mut self, ah: u32) -> Reply {
        let sh = self.shared.clone();
        match self.objs.ahs.remove(&ah) {
            Some(lc) => {
                let _ = sh.lcores[lc].cmds.send(Cmd::RemoveAh { client: self.id, ah });
                self.release(Obj::Kind(LimitKind::Ah), ah.into());
                (Response::Ok, vec![])
            }
            None => (err(libc::EINVAL, "no such AH"), vec![]),
        }
    }
}
