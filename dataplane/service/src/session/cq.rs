//! Completion channels and completion queues.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use pmrxe_abi::ctrl::Response;
use pmrxe_abi::ring::init_ring;
use pmrxe_abi::{CqSegmentLayout, ShmCqe};
use pmrxe_runtime::lcore::Cmd;
use pmrxe_runtime::shm::{EventFd, Segment};

use pmrxe_config::LimitKind;

use super::{drop_after_send, err, Reply, Session};
use crate::limits::Obj;

impl Session {
    pub(super) fn create_comp_channel(&mut self) -> Reply {
        let sh = self.shared.clone();
        let r = match self.reserve(Obj::Channel, 0) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        match EventFd::new() {
            Ok(e) => {
                let ch = sh.handle();
                let fd = e.fd().as_raw_fd();
                self.objs.channels.insert(ch, Arc::new(e));
                self.commit(r, ch.into());
                (Response::CompChannel { channel: ch }, vec![fd])
            }
            Err(e) => (err(libc::EMFILE, &e.to_string()), vec![]),
        }
    }

    pub(super) fn destroy_comp_channel(&mut self, channel: u32) -> Reply {
        match self.objs.channels.remove(&channel) {
            Some(_) => {
                self.release(Obj::Channel, channel.into());
                (Response::Ok, vec![])
            }
            None => (err(libc::EINVAL, "no such channel"), vec![]),
        }
    }

    pub(super) fn create_cq(&mut self, device: u32, cqe: u32, channel: Option<u32>) -> Reply {
        /// Smallest CQ ring (64-byte CQEs: one 4 KiB page).
        const MIN_CQ_RING: u32 = 64;
        let sh = self.shared.clone();
        if device as usize >= sh.devices.len() {
            return (err(libc::ENODEV, "no such device"), vec![]);
        }
        let max = sh.devices[device as usize].attr.max_cqe;
        if cqe == 0 || cqe > max {
            return (err(libc::EINVAL, &format!("cqe must be 1..={max}")), vec![]);
        }
        let ch = match channel {
            None => None,
            Some(c) => match self.objs.channels.get(&c) {
                Some(e) => Some(e.clone()),
                None => return (err(libc::EINVAL, "no such completion channel"), vec![]),
            },
        };
        let reservation = match self.reserve(Obj::Kind(LimitKind::Cq), device) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        // At least MIN_CQ_RING entries, so ibv_resize_cq can grow a small CQ in place.
        let cap = (cqe + 1).max(MIN_CQ_RING).next_power_of_two();
        let layout = CqSegmentLayout::new(cap);
        let seg = match Segment::create("pmrxe-cq", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment sized by the layout; CqNotify (zeroes) at 0, ring here.
        if let Err(e) = unsafe { init_ring::<ShmCqe>(seg.as_ptr().add(layout.ring_offset as usize), cap) } {
            return (err(libc::EINVAL, &e.to_string()), vec![]);
        }
        let cq = sh.handle();
        let lc = sh.lcore_for(self.home, device);
        let fd = seg.fd().as_raw_fd();
        let r: Result<(), String> =
            lcore_call!(sh.lcores[lc], AddCq { cq: cq, client: self.id, seg: seg.clone(), layout: layout, channel: ch });
        if let Err(e) = r {
            return (err(libc::EINVAL, &e), vec![]);
        }
        self.objs.cqs.insert(cq, lc);
        self.commit(reservation, cq.into());
        // `seg` stays alive in the lcore; `fd` is valid until the reply is sent (we hold `seg`).
        let resp = (Response::Cq { cq, cqe: cap - 1, layout }, vec![fd]);
        drop_after_send(seg);
        resp
    }

    pub(super) fn resize_cq(&mut self, cq: u32, cqe: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(&lc) = self.objs.cqs.get(&cq) else { return (err(libc::EINVAL, "no such CQ"), vec![]) };
        let r: Result<(), i32> = lcore_call!(sh.lcores[lc], ResizeCq { cq: cq, cqe: cqe });
        match r {
            Ok(()) => (Response::Ok, vec![]),
            Err(libc::EOPNOTSUPP) => (err(libc::EOPNOTSUPP, "the CQ's ring is smaller than the new size"), vec![]),
            Err(e) => (err(e, "more completions waiting than the new size"), vec![]),
        }
    }

    pub(super) fn destroy_cq(&mut self, cq: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(&lc) = self.objs.cqs.get(&cq) else { return (err(libc::EINVAL, "no such CQ"), vec![]) };
        let r: Result<(), i32> = lcore_call!(sh.lcores[lc], RemoveCq { cq: cq });
        match r {
            Ok(()) => {
                self.objs.cqs.remove(&cq);
                self.release(Obj::Kind(LimitKind::Cq), cq.into());
                (Response::Ok, vec![])
            }
            Err(e) => (err(e, "CQ busy or unknown"), vec![]),
        }
    }
}
