//! Completion queues and queue pairs.
use std::io;

use pmrxe_abi::client::{poll_cq, CqSegment, Mapping, QpSegment};
use pmrxe_abi::ctrl::{AhAttr, QpAttr, QpCap, Request, Response};
use pmrxe_abi::ring::{Consumer, Producer, PushError};
use pmrxe_abi::{Doorbell, ShmCqe, ShmRecvWqe, ShmSendWqe};

use super::context::{Context, Pd};
use super::{proto, Result};

/// A completion queue; [`Cq::poll`] reads CQEs straight from the shared ring.
pub struct Cq {
    ctx: Context,
    pub handle: u32,
    pub cqe: u32,
    cons: Consumer<ShmCqe>,
    _map: Mapping,
}

impl Cq {
    /// Create a CQ of at least `cqe` entries on `device`.
    pub fn create(ctx: &Context, device: u32, cqe: u32) -> Result<Cq> {
        let (r, fds) = ctx.call(&Request::CreateCq { device, cqe, channel: None }, &[])?;
        let Response::Cq { cq, cqe, layout } = r else { return Err(proto("CreateCq")) };
        let CqSegment { cons, map } = CqSegment::attach(&fds, &layout)?;
        Ok(Cq { ctx: ctx.clone(), handle: cq, cqe, cons, _map: map })
    }

    /// Copy up to `out.len()` completions out; returns how many (0 when empty). No syscall.
    #[inline]
    pub fn poll(&mut self, out: &mut [ShmCqe]) -> Result<usize> {
        poll_cq(&mut self.cons, out.len(), |i, e| out[i] = e).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// One completion, if any.
    #[inline]
    pub fn poll_one(&mut self) -> Result<Option<ShmCqe>> {
        let mut e = [ShmCqe::default()];
        Ok((self.poll(&mut e)? == 1).then_some(e[0]))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let _ = self.ctx.call_ok(&Request::DestroyCq { cq: self.handle });
    }
}

/// How to create a QP.
#[derive(Clone, Copy, Debug)]
pub struct QpOptions {
    /// `IBV_QPT_RC` = 2, `UC` = 3, `UD` = 4.
    pub qp_type: u32,
    pub cap: QpCap,
    pub sq_sig_all: bool,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            qp_type: pmrxe_abi::qp_table::qp_type::RC,
            cap: QpCap { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 },
            sq_sig_all: false,
        }
    }
}

/// libibverbs `enum ibv_qp_state` values and `enum ibv_qp_attr_mask` bits: the QP table's.
pub use pmrxe_abi::qp_table::{attr as mask, state};

/// A queue pair. Posting stages WQEs in the shared SQ/RQ ring, publishes them with one release
/// store and rings the doorbell: no syscall.
pub struct Qp {
    ctx: Context,
    pub qpn: u32,
    pub device: u32,
    pub cap: QpCap,
    sq: Producer<ShmSendWqe>,
    rq: Option<Producer<ShmRecvWqe>>,
    doorbell: Doorbell,
    _map: Mapping,
}

impl Qp {
    /// Create a QP on `pd`'s device with the given CQs.
    pub fn create(pd: &Pd, send_cq: &Cq, recv_cq: &Cq, opts: QpOptions) -> Result<Qp> {
        let ctx = &pd.ctx;
        let req = Request::CreateQp {
            device: pd.device,
            pd: pd.handle,
            qp_type: opts.qp_type,
            send_cq: send_cq.handle,
            recv_cq: recv_cq.handle,
            srq: None,
            cap: opts.cap,
            sq_sig_all: opts.sq_sig_all,
        };
        let (r, fds) = ctx.call(&req, &[])?;
        let Response::Qp { qpn, cap, layout, doorbell } = r else { return Err(proto("CreateQp")) };
        let QpSegment { sq, rq, map } = QpSegment::attach(&fds, &layout, true)?;
        Ok(Qp { ctx: ctx.clone(), qpn, device: pd.device, cap, sq, rq, doorbell, _map: map })
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.ctx.call_ok(&Request::ModifyQp { qpn: self.qpn, attr: *attr, mask })
    }

    /// The address vector to device `remote_device` (its RoCE v2 GID, IPv4-mapped at index 1
    /// when present, else the first GID).
    pub fn av_to(&self, remote_device: u32) -> Result<AhAttr> {
        let devs = self.ctx.devices();
        let local = devs.get(self.device as usize).ok_or_else(|| proto("device list"))?;
        let remote = devs.get(remote_device as usize).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such remote device"))?;
        let pick = |d: &pmrxe_abi::ctrl::DeviceInfo| d.gids.iter().find(|g| g.index == 1).or_else(|| d.gids.first()).cloned();
        let (lg, rg) = (pick(local).ok_or_else(|| proto("local GID"))?, pick(remote).ok_or_else(|| proto("remote GID"))?);
        Ok(AhAttr { dgid: rg.gid, sgid_index: lg.index as u8, hop_limit: 64, is_global: true, port_num: 1, ..Default::default() })
    }

    /// RESET → INIT → RTR → RTS towards `remote_qpn` at `av` (RC: with the given read/atomic
    /// depth; PSNs start at 0 on both sides). `path_mtu` is `enum ibv_mtu` (5 = 4096).
    pub fn connect(&self, remote_qpn: u32, av: AhAttr, path_mtu: u32, rd_atomic: u8) -> Result<()> {
        use mask::*;
        let init = QpAttr {
            qp_state: state::INIT,
            port_num: 1,
            pkey_index: 0,
            qp_access_flags: super::access::ALL,
            ..Default::default()
        };
        self.modify(&init, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS)?;
        let rtr = QpAttr {
            qp_state: state::RTR,
            path_mtu,
            dest_qp_num: remote_qpn,
            rq_psn: 0,
            ah_attr: av,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 1,
            ..Default::default()
        };
        self.modify(&rtr, STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER)?;
        let rts = QpAttr { qp_state: state::RTS, timeout: 14, retry_cnt: 7, rnr_retry: 7, sq_psn: 0, max_rd_atomic: rd_atomic, ..Default::default() };
        self.modify(&rts, STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC)
    }

    /// Free SQ ring slots (refreshes the consumer index).
    pub fn sq_free(&mut self) -> Result<u32> {
        self.sq.free().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Post send WQEs: all or nothing (`WouldBlock` when the ring lacks room), one publish, one
    /// doorbell.
    #[inline]
    pub fn post_send(&mut self, wqes: &[ShmSendWqe]) -> Result<()> {
        for (i, w) in wqes.iter().enumerate() {
            match self.sq.stage_prefixed(w) {
                Ok(()) => {}
                Err(PushError::Full(_)) if i == 0 => return Err(io::ErrorKind::WouldBlock.into()),
                Err(PushError::Full(_)) => {
                    // Partial batch: publish what fits so nothing staged is lost, then report.
                    self.ctx.conn().publish(&mut self.sq, self.doorbell);
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("SQ ring full after {i} WQEs")));
                }
                Err(PushError::Corrupt(_)) => return Err(io::Error::new(io::ErrorKind::InvalidData, "SQ ring corrupt")),
            }
        }
        self.ctx.conn().publish(&mut self.sq, self.doorbell);
        Ok(())
    }

    /// Stage one send WQE without publishing (`false` when the ring is full).
    #[inline]
    pub fn stage_send(&mut self, w: ShmSendWqe) -> bool {
        self.sq.stage_prefixed(&w).is_ok()
    }

    /// Publish staged send WQEs and ring the doorbell.
    #[inline]
    pub fn flush_send(&mut self) {
        self.ctx.conn().publish(&mut self.sq, self.doorbell);
    }

    /// Post receive WQEs (one publish, one doorbell).
    #[inline]
    pub fn post_recv(&mut self, wqes: &[ShmRecvWqe]) -> Result<()> {
        let rq = self.rq.as_mut().ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "QP has no receive queue"))?;
        for w in wqes {
            match rq.stage_prefixed(w) {
                Ok(()) => {}
                Err(PushError::Full(_)) => {
                    self.ctx.conn().publish(rq, self.doorbell);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Err(PushError::Corrupt(_)) => return Err(io::Error::new(io::ErrorKind::InvalidData, "RQ ring corrupt")),
            }
        }
        self.ctx.conn().publish(rq, self.doorbell);
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let _ = self.ctx.call_ok(&Request::DestroyQp { qpn: self.qpn });
    }
}
