//! Control commands from the service: create, modify, query and destroy the objects an
//! lcore owns (QPs, CQs, SRQs, clients, address handles), each answered on its reply channel.
use std::sync::atomic::Ordering;

use crossbeam::channel::TryRecvError;
use pmrxe_abi::ring::{Consumer, Producer};
use pmrxe_abi::{CqNotify, ShmCqe, ShmRecvWqe, ShmSendWqe, DOORBELL_SLOTS};
use pmrxe_port::Port;
use pmrxe_transport::{Qp, QpType, Srq};

use super::completions::CqTarget;
use super::{ClientSlot, Cmd, CqSlot, Lcore, QpSetup, QpSlot, SrqSlot, SRQ_SLOT};
use crate::stats::bump;

impl<L: Port> Lcore<L> {
    pub(super) fn commands(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.cmds.try_recv() {
                Ok(c) => {
                    any = true;
                    bump(&self.stats.commands, 1);
                    self.command(c);
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return any,
            }
        }
    }

    pub(super) fn command(&mut self, c: Cmd) {
        match c {
            Cmd::AddClient { client, page, events, events_fd } => {
                self.clients.push(ClientSlot { id: client, page, events, events_fd, slots: vec![0; DOORBELL_SLOTS] });
            }
            Cmd::RemoveClient { client, done } => {
                let qpns: Vec<u32> = self.engine.iter().filter(|(_, s)| s.client == client).map(|(q, _)| q.qpn()).collect();
                for q in qpns {
                    self.remove_qp(q);
                }
                let cqs: Vec<u32> = self.cq.index.iter().filter(|(_, &i)| self.cq.slots[i].as_ref().is_some_and(|c| c.client == client)).map(|(k, _)| *k).collect();
                for k in cqs {
                    if let Some(c) = self.cq.index.remove(&k).and_then(|i| self.cq.slots[i].take()) {
                        let _ = self.grave.send(Box::new(c));
                    }
                }
                let srqs: Vec<u32> = self.srqs.iter().filter(|(_, x)| x.client == client).map(|(k, _)| *k).collect();
                for k in srqs {
                    if let Some(x) = self.srqs.remove(&k) {
                        let _ = self.grave.send(Box::new((x, self.engine.remove_srq(k))));
                    }
                }
                self.posts.ahs.retain(|&(c, _), _| c != client);
                if self.posts.ahs.capacity() > 4 * self.posts.ahs.len().max(1024) {
                    self.posts.ahs.shrink_to(2 * self.posts.ahs.len().max(1024));
                }
                self.stats.address_handles.store(self.posts.ahs.len() as u64, Ordering::Relaxed);
                if let Some(i) = self.clients.iter().position(|c| c.id == client) {
                    let c = self.clients.swap_remove(i);
                    let _ = self.grave.send(Box::new(c));
                }
                let _ = done.send(());
            }
            Cmd::AddCq { cq, client, seg, layout, channel, done } => {
                // SAFETY: the service created this segment with `layout` and initialised the
                // ring; the Arc in the slot keeps it mapped as long as the producer lives.
                let ring = unsafe {
                    Producer::<ShmCqe>::attach(seg.as_ptr().add(layout.ring_offset as usize), seg.len() - layout.ring_offset as usize, layout.capacity)
                };
                let r = ring.map(|ring| {
                    let notify = seg.as_ptr() as *const CqNotify;
                    let slot = CqSlot { handle: cq, client, _seg: seg, ring, notify, channel, fresh: false, refs: 0 };
                    let i = match self.cq.slots.iter().position(Option::is_none) {
                        Some(i) => {
                            self.cq.slots[i] = Some(slot);
                            i
                        }
                        None => {
                            self.cq.slots.push(Some(slot));
                            self.cq.slots.len() - 1
                        }
                    };
                    if let Some(old) = self.cq.index.insert(cq, i).and_then(|o| self.cq.slots[o].take()) {
                        let _ = self.grave.send(Box::new(old));
                    }
                });
                let _ = done.send(r.map_err(|e| e.to_string()));
            }
            Cmd::RemoveCq { cq, done } => {
                let r = match self.cq.index.get(&cq).and_then(|&i| self.cq.slots[i].as_ref()) {
                    None => Err(libc::EINVAL),
                    Some(c) if c.refs > 0 => Err(libc::EBUSY),
                    Some(_) => {
                        if let Some(c) = self.cq.index.remove(&cq).and_then(|i| self.cq.slots[i].take()) {
                            let _ = self.grave.send(Box::new(c));
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::ResizeCq { cq, cqe, done } => {
                // Work posted before this call completes first (as on hardware, where the
                // resize is queued behind it), so the count below includes it.
                let now = self.clock.now();
                self.doorbells(now);
                self.transmit(now);
                self.ports.flush(&self.stats);
                self.receive(now);
                self.deliver_completions(now);
                let r = match self.cq.index.get(&cq).and_then(|&i| self.cq.slots[i].as_mut()) {
                    None => Err(libc::EINVAL),
                    Some(c) => {
                        let cap = c.ring.capacity();
                        match c.ring.free() {
                            Err(_) => Err(libc::EIO),
                            Ok(_) if cqe >= cap => Err(libc::EOPNOTSUPP),
                            Ok(free) if cap - free > cqe => Err(libc::EINVAL),
                            Ok(_) => Ok(()),
                        }
                    }
                };
                let _ = done.send(r);
            }
            Cmd::AddQp { setup, done } => {
                let _ = done.send(self.add_qp(*setup));
            }
            Cmd::ModifyQp { qpn, attr, mask, done } => {
                let mut src = self.posts.source(&self.stats);
                let mut cq = self.cq.writer(&self.stats);
                let r = match self.engine.modify(qpn, &attr, mask, &mut src, &mut cq) {
                    Some(Ok(())) => Ok(()),
                    Some(Err(_)) | None => Err(libc::EINVAL),
                };
                let _ = done.send(r);
            }
            Cmd::QueryQp { qpn, done } => {
                let a = self.engine.qp(qpn).map(Qp::query);
                let _ = done.send(a);
            }
            Cmd::DestroyQp { qpn, done } => {
                let r = if self.remove_qp(qpn) { Ok(()) } else { Err(libc::EINVAL) };
                let _ = done.send(r);
            }
            Cmd::AddAh { client, ah, av } => {
                self.posts.ahs.insert((client, ah), av);
                self.stats.address_handles.store(self.posts.ahs.len() as u64, Ordering::Relaxed);
            }
            Cmd::McastGroup { device, gid, members, announce } => self.set_group(device, gid, members, announce),
            Cmd::RemoveAh { client, ah } => {
                self.posts.ahs.remove(&(client, ah));
                self.stats.address_handles.store(self.posts.ahs.len() as u64, Ordering::Relaxed);
            }
            Cmd::AddSrq { srq, client, seg, layout, db_slot, done } => {
                let r = (|| {
                    let ci = self.clients.iter().position(|c| c.id == client).ok_or("unknown client")?;
                    if db_slot as usize >= DOORBELL_SLOTS || self.clients[ci].slots[db_slot as usize] != 0 {
                        return Err("doorbell slot in use".to_string());
                    }
                    // SAFETY: the service laid the segment out with `layout` and initialised the
                    // ring; the slot keeps the segment alive as long as the consumer.
                    let ring = unsafe { Consumer::<ShmRecvWqe>::attach(seg.as_ptr(), seg.len(), layout.capacity) }.map_err(|e| e.to_string())?;
                    let srqn = srq.srqn();
                    self.clients[ci].slots[db_slot as usize] = SRQ_SLOT | srqn;
                    self.engine.add_srq(*srq);
                    self.srqs.insert(srqn, SrqSlot { client, _seg: seg, ring, refs: 0, backlog: false });
                    Ok(())
                })();
                let _ = done.send(r);
            }
            Cmd::ModifySrq { srqn, attr, arm, done } => {
                let r = match self.engine.srq_mut(srqn) {
                    None => Err(libc::EINVAL),
                    Some(s) => {
                        if arm {
                            s.arm_limit(attr.srq_limit);
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::QuerySrq { srqn, done } => {
                let _ = done.send(self.engine.srq(srqn).map(Srq::query));
            }
            Cmd::RemoveSrq { srqn, done } => {
                let r = match self.srqs.get(&srqn) {
                    None => Err(libc::EINVAL),
                    Some(s) if s.refs > 0 => Err(libc::EBUSY),
                    Some(s) => {
                        let client = s.client;
                        if let Some(x) = self.srqs.remove(&srqn) {
                            let _ = self.grave.send(Box::new((x, self.engine.remove_srq(srqn))));
                        }
                        if let Some(c) = self.clients.iter_mut().find(|c| c.id == client) {
                            for v in c.slots.iter_mut().filter(|v| **v == SRQ_SLOT | srqn) {
                                *v = 0;
                            }
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::QpStats { done } => {
                let v = self.engine.iter().map(|(q, s)| (q.qpn(), s.client, q.stats().clone())).collect();
                let _ = done.send(v);
            }
        }
    }

    pub(super) fn add_qp(&mut self, s: QpSetup) -> Result<(), String> {
        let dev = self.ports.of_device(s.device).ok_or("device not on this lcore")?;
        let (Some(&send_cq), Some(&recv_cq)) = (self.cq.index.get(&s.send_cq), self.cq.index.get(&s.recv_cq)) else {
            return Err("unknown CQ".into());
        };
        let ci = self.clients.iter().position(|c| c.id == s.client).ok_or("unknown client")?;
        if s.db_slot as usize >= DOORBELL_SLOTS || self.clients[ci].slots[s.db_slot as usize] != 0 {
            return Err("doorbell slot in use".into());
        }
        let base = s.seg.as_ptr();
        let len = s.seg.len();
        // SAFETY: the service laid the segment out with `layout` and initialised both rings;
        // the slot keeps the segment alive as long as the consumers.
        let sq = unsafe { Consumer::<ShmSendWqe>::attach(base.add(s.layout.sq_offset as usize), len - s.layout.sq_offset as usize, s.layout.sq_capacity) }
            .map_err(|e| e.to_string())?;
        let rq = if s.layout.rq_capacity > 0 {
            // SAFETY: as above.
            Some(unsafe { Consumer::<ShmRecvWqe>::attach(base.add(s.layout.rq_offset as usize), len - s.layout.rq_offset as usize, s.layout.rq_capacity) }.map_err(|e| e.to_string())?)
        } else {
            None
        };
        if let Some(srqn) = s.qp.srq() {
            if !self.srqs.contains_key(&srqn) {
                return Err("unknown SRQ".into());
            }
        }
        let mut s = s;
        s.qp.set_congestion(self.ports[dev].dev.cc);
        let qpn = s.qp.qpn();
        let is_ud = s.qp.qp_type() == QpType::Ud;
        let srq = s.qp.srq();
        let slot = QpSlot {
            client: s.client,
            dev,
            cq: CqTarget { seg: s.seg, send: send_cq, recv: recv_cq, own_rq: rq.is_some() },
            sq,
            rq,
            is_ud,
            path: None,
        };
        self.engine.insert(s.qp, slot).map_err(|e| e.to_string())?;
        if let Some(x) = srq.and_then(|n| self.srqs.get_mut(&n)) {
            x.refs += 1;
        }
        self.clients[ci].slots[s.db_slot as usize] = qpn;
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cq.slots[cq].as_mut() {
                c.refs += 1;
            }
        }
        Ok(())
    }

    pub(super) fn remove_qp(&mut self, qpn: u32) -> bool {
        let Some((qp, slot)) = self.engine.remove(qpn) else { return false };
        for cq in [slot.cq.send, slot.cq.recv] {
            if let Some(c) = self.cq.slots[cq].as_mut() {
                c.refs = c.refs.saturating_sub(1);
            }
        }
        if let Some(x) = qp.srq().and_then(|n| self.srqs.get_mut(&n)) {
            x.refs = x.refs.saturating_sub(1);
        }
        if let Some(c) = self.clients.iter_mut().find(|c| c.id == slot.client) {
            for s in c.slots.iter_mut().filter(|s| **s == qpn) {
                *s = 0;
            }
        }
        self.posts.forget(qpn, self.engine.layout().slot(qpn));
        let _ = self.grave.send(Box::new((qp, slot)));
        true
    }

    // ---- receive ------------------------------------------------------------------------
}
