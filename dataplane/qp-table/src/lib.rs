//! The QP state-transition table (IBA 10.3.1, table 91, as the kernel's `qp_state_table`
//! encodes it), in libibverbs numbers: `enum ibv_qp_state`, `enum ibv_qp_type` and the
//! `enum ibv_qp_attr_mask` bits. One table for both sides: the shim checks a modify against it
//! before sending (a bad mask fails with EINVAL locally, as on a hardware provider) and the
//! engine checks it again before the real transition.

/// `enum ibv_qp_state` values.
pub mod state {
    /// IBV_QPS_RESET
    pub const RESET: u32 = 0;
    /// IBV_QPS_INIT
    pub const INIT: u32 = 1;
    /// IBV_QPS_RTR
    pub const RTR: u32 = 2;
    /// IBV_QPS_RTS
    pub const RTS: u32 = 3;
    /// IBV_QPS_SQD
    pub const SQD: u32 = 4;
    /// IBV_QPS_SQE
    pub const SQE: u32 = 5;
    /// IBV_QPS_ERR
    pub const ERR: u32 = 6;
}

/// `enum ibv_qp_type` values pmrxe offers.
pub mod qp_type {
    /// IBV_QPT_RC
    pub const RC: u32 = 2;
    /// IBV_QPT_UC
    pub const UC: u32 = 3;
    /// IBV_QPT_UD
    pub const UD: u32 = 4;
}

/// `enum ibv_qp_attr_mask` bits.
pub mod attr {
    /// IBV_QP_STATE
    pub const STATE: u32 = 1;
    /// IBV_QP_CUR_STATE
    pub const CUR_STATE: u32 = 1 << 1;
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// IBV_QP_ACCESS_FLAGS
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// IBV_QP_PKEY_INDEX
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// IBV_QP_PORT
    pub const PORT: u32 = 1 << 5;
    /// IBV_QP_QKEY
    pub const QKEY: u32 = 1 << 6;
    /// IBV_QP_AV
    pub const AV: u32 = 1 << 7;
    /// IBV_QP_PATH_MTU
    pub const PATH_MTU: u32 = 1 << 8;
    /// IBV_QP_TIMEOUT
    pub const TIMEOUT: u32 = 1 << 9;
    /// IBV_QP_RETRY_CNT
    pub const RETRY_CNT: u32 = 1 << 10;
    /// IBV_QP_RNR_RETRY
    pub const RNR_RETRY: u32 = 1 << 11;
    /// IBV_QP_RQ_PSN
    pub const RQ_PSN: u32 = 1 << 12;
    /// IBV_QP_MAX_QP_RD_ATOMIC
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// IBV_QP_ALT_PATH
    pub const ALT_PATH: u32 = 1 << 14;
    /// IBV_QP_MIN_RNR_TIMER
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// IBV_QP_SQ_PSN
    pub const SQ_PSN: u32 = 1 << 16;
    /// IBV_QP_MAX_DEST_RD_ATOMIC
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// IBV_QP_PATH_MIG_STATE
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// IBV_QP_CAP
    pub const CAP: u32 = 1 << 19;
    /// IBV_QP_DEST_QPN
    pub const DEST_QPN: u32 = 1 << 20;
}

/// Required and optional attribute masks of one transition (`IBV_QP_STATE` is implied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Masks {
    /// Must be present.
    pub required: u32,
    /// May be present.
    pub optional: u32,
}

/// The masks of `cur → next` for a QP of type `ty` (RC, UC, UD), or `None` when the
/// transition does not exist for that type.
pub fn transition(ty: u32, cur: u32, next: u32) -> Option<Masks> {
    use attr::*;
    use state::*;
    if ![qp_type::RC, qp_type::UC, qp_type::UD].contains(&ty) || cur > ERR || next > ERR {
        return None;
    }
    // Per type: (UD, UC, RC).
    let by = |ud: u32, uc: u32, rc: u32| match ty {
        qp_type::UD => ud,
        qp_type::UC => uc,
        _ => rc,
    };
    let t = |required: u32, optional: u32| Some(Masks { required, optional });
    let init = by(PKEY_INDEX | PORT | QKEY, PKEY_INDEX | PORT | ACCESS_FLAGS, PKEY_INDEX | PORT | ACCESS_FLAGS);
    match (cur, next) {
        (_, RESET) | (_, ERR) => t(0, 0),
        (RESET, INIT) => t(init, 0),
        (INIT, INIT) => t(0, init),
        (INIT, RTR) => t(
            by(0, AV | PATH_MTU | DEST_QPN | RQ_PSN, AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
            by(PKEY_INDEX | QKEY, ALT_PATH | ACCESS_FLAGS | PKEY_INDEX, ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
        ),
        (RTR, RTS) => t(
            by(SQ_PSN, SQ_PSN, TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC),
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
            ),
        ),
        (RTS, RTS) | (SQD, RTS) => t(
            0,
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
            ),
        ),
        (RTS, SQD) => t(0, EN_SQD_ASYNC_NOTIFY),
        (SQD, SQD) => t(
            0,
            by(
                PKEY_INDEX | QKEY,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
        ),
        // SQE (send queue error) exists for UC and UD only: an RC QP never enters it (its send
        // errors take it to ERR).
        (SQE, RTS) if ty != qp_type::RC => t(0, by(CUR_STATE | QKEY, CUR_STATE | ACCESS_FLAGS, 0)),
        _ => None,
    }
}

/// Check a modify request: `mask` (with or without `IBV_QP_STATE`) against the transition it
/// asks for from `cur`. Bits in `extra` (provider-specific ones a caller lets the other side
/// judge) are not checked. Without `IBV_QP_STATE` the QP stays in `cur` and every attribute
/// must be optional for `cur → cur`.
pub fn check(ty: u32, cur: u32, next: u32, mask: u32, extra: u32) -> bool {
    let Some(m) = transition(ty, cur, next) else { return false };
    let rest = mask & !attr::STATE;
    rest & m.required == m.required && rest & !(m.required | m.optional | extra) == 0
}

#[cfg(test)]
mod tests {
    use super::attr::*;
    use super::qp_type::*;
    use super::state::*;
    use super::*;

    const STATES: [u32; 7] = [RESET, INIT, RTR, RTS, SQD, SQE, ERR];

    /// IBA table 91 (and rdma-core's / the kernel's `qp_state_table`) written as the list of
    /// valid transitions per type, independently of `transition`'s match: every pair listed
    /// exists, every pair not listed does not.
    fn valid(ty: u32, cur: u32, next: u32) -> bool {
        let listed: &[(u32, u32)] = &[(RESET, INIT), (INIT, INIT), (INIT, RTR), (RTR, RTS), (RTS, RTS), (SQD, RTS), (RTS, SQD), (SQD, SQD)];
        next == RESET || next == ERR || listed.contains(&(cur, next)) || (cur == SQE && next == RTS && ty != RC)
    }

    #[test]
    fn every_state_pair_of_every_type_matches_the_ibta_table() {
        for ty in [RC, UC, UD] {
            for cur in STATES {
                for next in STATES {
                    assert_eq!(transition(ty, cur, next).is_some(), valid(ty, cur, next), "type {ty}: {cur} -> {next}");
                }
            }
        }
        assert_eq!(transition(1, RESET, INIT), None, "unknown QP type");
        assert_eq!(transition(RC, 7, RESET), None, "unknown state");
    }

    #[test]
    fn every_single_attribute_is_judged_per_transition() {
        // Walk every (type, transition, one attribute bit): with the required set plus that bit
        // the check passes exactly when the bit is required or optional; dropping any required
        // bit always fails.
        for ty in [RC, UC, UD] {
            for cur in STATES {
                for next in STATES {
                    let Some(m) = transition(ty, cur, next) else {
                        assert!(!check(ty, cur, next, STATE, 0));
                        continue;
                    };
                    assert_eq!(m.required & m.optional, 0, "a bit is both required and optional");
                    for bit in (1..=20).map(|b| 1u32 << b) {
                        let ok = check(ty, cur, next, STATE | m.required | bit, 0);
                        assert_eq!(ok, (m.required | m.optional) & bit != 0, "type {ty} {cur}->{next} bit {bit:#x}");
                        if m.required & bit != 0 {
                            assert!(!check(ty, cur, next, STATE | (m.required & !bit), 0), "required bit {bit:#x} dropped");
                        }
                    }
                    assert!(check(ty, cur, next, STATE | m.required | CAP, CAP), "extra bits are left to the caller");
                }
            }
        }
    }

    #[test]
    fn perftest_and_pingpong_masks() {
        // Masks ib_write_bw and ibv_rc_pingpong pass (PLATFORM.md §4).
        assert!(check(RC, RESET, INIT, 0x39, 0));
        assert!(check(RC, INIT, RTR, 0x129181, 0));
        assert!(check(RC, RTR, RTS, 0x12e01, 0));
        assert!(!check(RC, INIT, RTR, 0x129181 & !DEST_QPN, 0));
        assert!(check(UD, RESET, INIT, STATE | PKEY_INDEX | PORT | QKEY, 0));
        assert!(check(UD, INIT, RTR, STATE, 0));
        assert!(check(UD, RTR, RTS, STATE | SQ_PSN, 0));
    }
}
