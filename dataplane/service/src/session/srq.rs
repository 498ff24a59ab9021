//! Shared receive queues.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use pmrxe_abi::ctrl::Response;
use pmrxe_abi::ring::init_ring;
use pmrxe_abi::{Doorbell, ShmRecvWqe, SrqSegmentLayout};
use pmrxe_runtime::lcore::Cmd;
use pmrxe_runtime::shm::Segment;
use pmrxe_transport::{Srq, SrqAttr};

use pmrxe_config::LimitKind;

use super::{err, Reply, Session, SrqRec};
use crate::limits::Obj;

impl Session {
    pub(super) fn create_srq(&mut self, device: u32, pd: u32, max_wr: u32, max_sge: u32, srq_limit: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(&pd_dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        if pd_dev != device {
            return (err(libc::EINVAL, "PD belongs to another device"), vec![]);
        }
        let d = &sh.devices[device as usize].attr;
        if max_wr == 0 || max_wr > d.max_srq_wr || max_sge > d.max_srq_sge {
            return (err(libc::EINVAL, "SRQ attributes exceed the device limits"), vec![]);
        }
        let reservation = match self.reserve(Obj::Kind(LimitKind::Srq), device) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let srqn = sh.handle();
        let srq = match Srq::new(srqn, SrqAttr { max_wr, max_sge: max_sge.max(1), srq_limit }) {
            Ok(s) => s,
            Err(e) => return (err(libc::EINVAL, &format!("{e:?}")), vec![]),
        };
        let Some(slot) = self.objs.db_used.iter().position(|u| !u) else { return (err(libc::ENOMEM, "too many queues for this client"), vec![]) };
        let layout = SrqSegmentLayout::new(max_wr.next_power_of_two());
        let seg = match Segment::create("pmrxe-srq", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment laid out by `layout` (one ring at offset 0).
        if unsafe { init_ring::<ShmRecvWqe>(seg.as_ptr(), layout.capacity) }.is_err() {
            return (err(libc::EINVAL, "ring layout"), vec![]);
        }
        let lc = sh.lcore_for(self.home, device);
        let fd = seg.fd().as_raw_fd();
        let r: Result<(), String> =
            lcore_call!(sh.lcores[lc], AddSrq { srq: Box::new(srq), client: self.id, seg: seg.clone(), layout: layout, db_slot: slot as u16 });
        if let Err(e) = r {
            return (err(libc::EINVAL, &e), vec![]);
        }
        self.objs.db_used[slot] = true;
        self.objs.srqs.insert(srqn, SrqRec { lcore: lc, db_slot: slot as u16 });
        self.commit(reservation, srqn.into());
        let db = Doorbell { lcore: sh.lcores[lc].index as u16, slot: slot as u16 };
        (Response::Srq { srq: srqn, max_wr: layout.capacity, max_sge: max_sge.max(1), layout, doorbell: db }, vec![fd])
    }

    pub(super) fn modify_srq(&mut self, srq: u32, srq_limit: u32, mask: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
        // IBV_SRQ_MAX_WR = 1 (resize: not supported), IBV_SRQ_LIMIT = 2.
        if mask & 1 != 0 {
            return (err(libc::EOPNOTSUPP, "SRQ resize is not supported"), vec![]);
        }
        let attr = SrqAttr { max_wr: 0, max_sge: 0, srq_limit };
        let res: Result<(), i32> = lcore_call!(sh.lcores[r.lcore], ModifySrq { srqn: srq, attr: attr, arm: mask & 2 != 0 });
        match res {
            Ok(()) => (Response::Ok, vec![]),
            Err(e) => (err(e, "modify_srq"), vec![]),
        }
    }

    pub(super) fn query_srq(&mut self, srq: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
        let a: Option<SrqAttr> = lcore_call!(sh.lcores[r.lcore], QuerySrq { srqn: srq });
        match a {
            Some(a) => (Response::SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit }, vec![]),
            None => (err(libc::EINVAL, "no such SRQ"), vec![]),
        }
    }

    pub(super) fn destroy_srq(&mut self, srq: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
        let (lc, slot) = (r.lcore, r.db_slot);
        let res: Result<(), i32> = lcore_call!(sh.lcores[lc], RemoveSrq { srqn: srq });
        match res {
            Ok(()) => {
                self.objs.srqs.remove(&srq);
                self.objs.db_used[slot as usize] = false;
                self.release(Obj::Kind(LimitKind::Srq), srq.into());
                (Response::Ok, vec![])
            }
            Err(e) => (err(e, "SRQ busy or unknown"), vec![]),
        }
    }
}
