//! This client's side of [`crate::limits`]: reserve before creating, commit what was created,
//! release what was destroyed (everything left is released when the session ends).

use crate::limits::{Obj, Reservation};

use super::{err, Reply, Session};

impl Session {
    /// Reserve one `obj` on `device` against the device limit, this client's cap and the fd
    /// budgets; `Err`: the refusal to answer (`ENOMEM` device/service, `EAGAIN` client cap).
    #[allow(clippy::result_large_err)] // the reply itself, once per creation on the control path
    pub(super) fn reserve(&mut self, obj: Obj, device: u32) -> Result<Reservation, Reply> {
        self.shared.limits.reserve(&self.objs.usage, obj, device).map_err(|r| (err(r.errno, &r.msg), vec![]))
    }

    /// The reservation became object `handle`.
    pub(super) fn commit(&mut self, r: Reservation, handle: u64) {
        self.objs.usage.commit(r, self.id, handle);
    }

    /// Object `handle` is gone.
    pub(super) fn release(&mut self, obj: Obj, handle: u64) {
        self.objs.usage.release(obj, handle);
    }

    /// A segment request (`AddSegment`, `AddSharedSegment`, `ReleaseSegment`) of segment
    /// `seg`, counted by what it did to this client's segment table: a new segment holds
    /// one service fd, a released one gives it back.
    pub(super) fn counted_segment(&mut self, seg: u64, adds: bool, f: impl FnOnce(&mut Self) -> Reply) -> Reply {
        let r = if adds && !self.objs.segs.contains_key(&seg) {
            match self.reserve(Obj::Segment, 0) {
                Ok(r) => Some(r),
                Err(reply) => return reply,
            }
        } else {
            None
        };
        let reply = f(self);
        let present = self.objs.segs.contains_key(&seg);
        match r {
            Some(r) if present => self.commit(r, seg),
            _ if !present && self.objs.usage.holds(Obj::Segment, seg) => self.release(Obj::Segment, seg),
            _ => {}
        }
        reply
    }
}

impl Session {
    /// [`Session::reserve`] on the device of this client's PD `pd` (`EINVAL`: no such PD).
    #[allow(clippy::result_large_err)] // as `reserve`
    pub(super) fn reserve_on_pd(&mut self, kind: pmrxe_config::LimitKind, pd: u32) -> Result<Reservation, Reply> {
        let Some(&dev) = self.objs.pds.get(&pd) else { return Err((err(libc::EINVAL, "no such PD"), vec![])) };
        self.reserve(Obj::Kind(kind), dev)
    }
}
