//! The QP state-transition / attribute-mask table the shim owns (IBTA 10.3.1, table 91 as
//! the kernel's `ib_modify_qp_is_ok` encodes it), checked before a ModifyQp is sent so a bad
//! mask fails with EINVAL locally, like a hardware provider. The service checks again.
use crate::boundary::{Errno, Res};
use crate::sys::*;

const STATE: u32 = IBV_QP_STATE;
const CUR: u32 = IBV_QP_CUR_STATE;

/// (required, optional) attribute masks for `cur → next` on a QP of `qp_type`, or None when
/// the transition does not exist. `IBV_QP_STATE` is always required and not listed.
pub fn masks(qp_type: u32, cur: u32, next: u32) -> Option<(u32, u32)> {
    let rc = qp_type == IBV_QPT_RC;
    let uc = qp_type == IBV_QPT_UC;
    let ud = qp_type == IBV_QPT_UD;
    let any = |r: u32, o: u32| Some((r, o));
    match (cur, next) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => any(0, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) | (IBV_QPS_INIT, IBV_QPS_INIT) => {
            let m = if ud { IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY } else { IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS };
            if cur == IBV_QPS_RESET {
                any(m, 0)
            } else {
                any(0, m)
            }
        }
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            if rc {
                any(
                    IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                    IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                )
            } else if uc {
                any(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN, IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX)
            } else {
                any(0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY)
            }
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            if rc {
                any(
                    IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
                    CUR | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE,
                )
            } else if uc {
                any(IBV_QP_SQ_PSN, CUR | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE)
            } else {
                any(IBV_QP_SQ_PSN, CUR | IBV_QP_QKEY)
            }
        }
        (IBV_QPS_RTS, IBV_QPS_RTS) | (IBV_QPS_SQD, IBV_QPS_RTS) | (IBV_QPS_SQE, IBV_QPS_RTS) => {
            if rc {
                any(0, CUR | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER)
            } else if uc {
                any(0, CUR | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE)
            } else {
                any(0, CUR | IBV_QP_QKEY)
            }
        }
        (IBV_QPS_RTS, IBV_QPS_SQD) => any(0, IBV_QP_EN_SQD_ASYNC_NOTIFY),
        (IBV_QPS_SQD, IBV_QPS_SQD) => any(
            0,
            IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_PATH_MIG_STATE,
        ),
        _ => None,
    }
}

/// Validate a modify request against the table. Without `IBV_QP_STATE` the QP stays in its
/// state and the attributes must be optional for `cur → cur`.
pub fn check(qp_type: u32, cached_cur: u32, attr: &ibv_qp_attr, mask: u32) -> Res<()> {
    let cur = if mask & CUR != 0 { attr.cur_qp_state } else { cached_cur };
    let next = if mask & STATE != 0 { attr.qp_state } else { cur };
    let (req, opt) = masks(qp_type, cur, next).ok_or(Errno::INVAL)?;
    let rest = mask & !STATE;
    // IBV_QP_CAP and IBV_QP_RATE_LIMIT are provider-specific; let the service decide.
    let extra = IBV_QP_CAP | IBV_QP_RATE_LIMIT;
    if rest & req != req || rest & !(req | opt | extra) != 0 {
        return Err(Errno::INVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(state: u32) -> ibv_qp_attr {
        // SAFETY: plain C data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        a
    }

    #[test]
    fn perftest_and_rc_pingpong_masks_pass() {
        // Masks observed from ib_write_bw (PLATFORM.md §4).
        assert!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_INIT), 0x39).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_INIT, &attr(IBV_QPS_RTR), 0x129181).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_RTR, &attr(IBV_QPS_RTS), 0x12e01).is_ok());
        // UD: INIT needs QKEY, RTR only STATE, RTS SQ_PSN.
        assert!(check(IBV_QPT_UD, IBV_QPS_RESET, &attr(IBV_QPS_INIT), STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY).is_ok());
        assert!(check(IBV_QPT_UD, IBV_QPS_INIT, &attr(IBV_QPS_RTR), STATE).is_ok());
        assert!(check(IBV_QPT_UD, IBV_QPS_RTR, &attr(IBV_QPS_RTS), STATE | IBV_QP_SQ_PSN).is_ok());
    }

    #[test]
    fn missing_required_or_unexpected_attrs_are_einval() {
        // RTR without DEST_QPN.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_INIT, &attr(IBV_QPS_RTR), 0x129181 & !IBV_QP_DEST_QPN), Err(Errno::INVAL));
        // RESET -> RTS does not exist.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_RTS), STATE), Err(Errno::INVAL));
        // SQ_PSN is not allowed on RESET -> INIT.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_INIT), 0x39 | IBV_QP_SQ_PSN), Err(Errno::INVAL));
        // Anything -> ERR / RESET needs nothing.
        assert!(check(IBV_QPT_RC, IBV_QPS_RTS, &attr(IBV_QPS_ERR), STATE).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_ERR, &attr(IBV_QPS_RESET), STATE).is_ok());
    }
}
