//! Early QP modify checks in the shim: the IBTA state-transition table shared with the engine
//! (`pmrxe_abi::qp_table`), checked before a ModifyQp is sent so a bad mask fails with EINVAL
//! locally, like a hardware provider. The service checks again against the same table.
use crate::boundary::{Errno, Res};
use crate::sys::*;

/// Validate a modify request against the table. Without `IBV_QP_STATE` the QP stays in its
/// state and the attributes must be optional for `cur → cur`.
pub fn check(qp_type: u32, cached_cur: u32, attr: &ibv_qp_attr, mask: u32) -> Res<()> {
    let cur = if mask & IBV_QP_CUR_STATE != 0 { attr.cur_qp_state } else { cached_cur };
    let next = if mask & IBV_QP_STATE != 0 { attr.qp_state } else { cur };
    // IBV_QP_CAP and IBV_QP_RATE_LIMIT are provider-specific; let the service decide.
    if pmrxe_abi::qp_table::check(qp_type, cur, next, mask, IBV_QP_CAP | IBV_QP_RATE_LIMIT) {
        Ok(())
    } else {
        Err(Errno::INVAL)
    }
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
    fn the_shared_table_speaks_libibverbs_numbers() {
        use pmrxe_abi::qp_table::{attr as a, qp_type as t, state as s};
        assert_eq!((t::RC, t::UC, t::UD), (IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD));
        assert_eq!((s::RESET, s::INIT, s::RTR, s::RTS, s::SQD, s::SQE, s::ERR), (IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR));
        assert_eq!((a::STATE, a::CUR_STATE, a::AV, a::SQ_PSN, a::DEST_QPN, a::CAP), (IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_AV, IBV_QP_SQ_PSN, IBV_QP_DEST_QPN, IBV_QP_CAP));
        assert_eq!((a::PATH_MIG_STATE, a::MAX_DEST_RD_ATOMIC, a::MIN_RNR_TIMER), (IBV_QP_PATH_MIG_STATE, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER));
    }

    #[test]
    fn perftest_and_rc_pingpong_masks_pass() {
        // Masks observed from ib_write_bw (PLATFORM.md §4).
        assert!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_INIT), 0x39).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_INIT, &attr(IBV_QPS_RTR), 0x129181).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_RTR, &attr(IBV_QPS_RTS), 0x12e01).is_ok());
        // UD: INIT needs QKEY, RTR only STATE, RTS SQ_PSN.
        assert!(check(IBV_QPT_UD, IBV_QPS_RESET, &attr(IBV_QPS_INIT), IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY).is_ok());
        assert!(check(IBV_QPT_UD, IBV_QPS_INIT, &attr(IBV_QPS_RTR), IBV_QP_STATE).is_ok());
        assert!(check(IBV_QPT_UD, IBV_QPS_RTR, &attr(IBV_QPS_RTS), IBV_QP_STATE | IBV_QP_SQ_PSN).is_ok());
    }

    #[test]
    fn missing_required_or_unexpected_attrs_are_einval() {
        // RTR without DEST_QPN.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_INIT, &attr(IBV_QPS_RTR), 0x129181 & !IBV_QP_DEST_QPN), Err(Errno::INVAL));
        // RESET -> RTS does not exist.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_RTS), IBV_QP_STATE), Err(Errno::INVAL));
        // SQ_PSN is not allowed on RESET -> INIT.
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_RESET, &attr(IBV_QPS_INIT), 0x39 | IBV_QP_SQ_PSN), Err(Errno::INVAL));
        // An RC QP never is in SQE: SQE -> RTS is refused as the engine refuses it (the two
        // tables disagreed here before they were one).
        assert_eq!(check(IBV_QPT_RC, IBV_QPS_SQE, &attr(IBV_QPS_RTS), IBV_QP_STATE), Err(Errno::INVAL));
        // Anything -> ERR / RESET needs nothing.
        assert!(check(IBV_QPT_RC, IBV_QPS_RTS, &attr(IBV_QPS_ERR), IBV_QP_STATE).is_ok());
        assert!(check(IBV_QPT_RC, IBV_QPS_ERR, &attr(IBV_QPS_RESET), IBV_QP_STATE).is_ok());
    }
}
