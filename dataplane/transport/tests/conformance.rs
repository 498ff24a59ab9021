//! SEMANTICS.md §7 conformance scenarios A1–F8, one test each, on the sim wire (setup: RC
//! A↔B, MTU 1024, timeout 14, retry_cnt 3, rnr_retry 3, rd_atomic 4; FMR X from
//! `alloc_mr(max_num_sg = 16)`).
mod common;
use common::*;
use pmrxe_mem::{Access, Key, MrState, MwType, Region, SgEntry};
use pmrxe_transport::sim::{Fault, PairParams};
use pmrxe_transport::{CqSide, Instant, QpState, RxPacket, SendFlags, SendOp, SendWqe, WcFlags, WcStatus};
use pmrxe_wire::{AtomicEthRepr, BthRepr, MsgPos, NakCode, Opcode, Psn, Qpn, RethRepr, Syndrome, TransportHeaders};

const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::REMOTE_WRITE;
const RR: Access = Access::REMOTE_READ;

fn reg_mr(id: u64, mr: Key, key: Key, access: Access) -> SendWqe {
    SendWqe::new(id, SendOp::RegMr { mr, key, access, iova: None, length: None }).flags(sig())
}
fn local_inv(id: u64, key: Key) -> SendWqe {
    SendWqe::new(id, SendOp::LocalInv { key }).flags(sig())
}
fn st(sim: &Sim, node: usize, qpn: u32) -> QpState {
    sim.nodes[node].qp(qpn).state()
}
use pmrxe_transport::sim::Sim;
fn stats(sim: &Sim, node: usize, qpn: u32) -> pmrxe_transport::QpStats {
    sim.nodes[node].qp(qpn).stats().clone()
}
fn mr_state(sim: &Sim, node: usize, key: Key) -> MrState {
    sim.nodes[node].mem.table().query(key).expect("mr").state
}
/// FMR X on A, registered with key byte +1 and `access`; returns (X, key).
fn fmr_valid(sim: &mut Sim, pages: usize, first_off: usize, access: Access) -> (Fmr, Key) {
    let x = fmr(sim, A, pages, first_off);
    let k = x.key.inc();
    post(sim, A, QA, reg_mr(900, x.key, k, access));
    drive(sim);
    assert_eq!(statuses(&send_cqes(sim, A, QA)), vec![WcStatus::Success]);
    (x, k)
}

// ---------------------------------------------------------------- A. MR lifecycle and keys

#[test]
fn a1_write_with_free_fmr_lkey_is_loc_prot_err_then_flush() {
    let mut sim = pair();
    let x = fmr(&sim, A, 4, 0);
    let b = reg(&sim, B, 8192, ALL);
    let src = pmrxe_mem::Sge { addr: x.iova(&sim, A), len: 100, lkey: x.key };
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Write).sge(src).remote(b.addr, b.rkey()).flags(sig()));
    let small = reg(&sim, A, 64, ALL);
    post(&mut sim, A, QA, write(2, &small, 0, 8, b.addr, b.rkey()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&c), vec![WcStatus::LocProtErr, WcStatus::WrFlushErr]);
    assert_eq!(st(&sim, A, QA), QpState::Err);
}

#[test]
fn a2_reg_mr_then_remote_write_and_stale_key_naks() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 4, 0x100, LW | RW | RR);
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 4096, ALL);
    b.write(0, &pattern(500, 4));
    post(&mut sim, B, QB, write(1, &b, 0, 500, iova + 0x100, k.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success]);
    assert_eq!(x.read(0x200, 500), pattern(500, 4));
    // Stale rkey k-1: NAK 0x62, REM_ACCESS_ERR, both QPs in ERR (class C).
    post(&mut sim, B, QB, write(2, &b, 0, 10, iova + 0x100, x.key.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemAccessErr]);
    assert!(sim.trace.iter().any(|p| p.syndrome == Some(Syndrome::Nak(NakCode::RemoteAccess))));
    assert_eq!(st(&sim, A, QA), QpState::Err);
    assert_eq!(st(&sim, B, QB), QpState::Err);
}

#[test]
fn a3_reg_mr_on_valid_mr_is_loc_qp_op_err() {
    let sim = pair();
    let x = fmr(&sim, A, 4, 0);
    drop(sim);
    // X is registered (VALID) by the setup WR, then registered again.
    let _ = x;
    let mut sim = pair();
    let x = fmr(&sim, A, 4, 0);
    post(&mut sim, A, QA, reg_mr(1, x.key, x.key.inc(), LW | RW));
    post(&mut sim, A, QA, reg_mr(2, x.key.inc(), x.key.inc().inc(), LW | RW));
    post(&mut sim, A, QA, SendWqe::new(3, SendOp::Send).flags(sig()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&c), vec![WcStatus::Success, WcStatus::LocQpOpErr, WcStatus::WrFlushErr]);
    assert_eq!(st(&sim, A, QA), QpState::Err);
}

#[test]
fn a4_reg_mr_key_index_mismatch_is_loc_qp_op_err() {
    let mut sim = pair();
    let x = fmr(&sim, A, 4, 0);
    let bad = Key::new(x.key.index() + 1, 7);
    post(&mut sim, A, QA, reg_mr(1, x.key, bad, LW));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocQpOpErr]);
}

#[test]
fn a5_reg_mr_from_other_pd_is_loc_qp_op_err() {
    let mut sim = pair();
    let key = sim.nodes[A].mem.table().alloc_mr(2, 16).unwrap();
    let region = Region::zeroed(3 * 4096);
    let off = ((4096 - region.addr() % 4096) % 4096) as usize;
    sim.nodes[A].mem.table().map_mr_sg(key, &[SgEntry { region: &region, offset: off, len: 4096 }], 0, 4096).unwrap();
    post(&mut sim, A, QA, reg_mr(1, key, key.inc(), LW));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocQpOpErr]);
}

#[test]
fn a6_local_inv_then_remote_read_naks_remote_access() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 4, 0, LW | RW | RR);
    let iova = x.iova(&sim, A);
    post(&mut sim, A, QA, local_inv(1, k));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, B, QB, read(2, &b, 0, 100, iova, k.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemAccessErr]);
}

#[test]
fn a7_local_inv_wrong_key_byte_is_loc_qp_op_err() {
    let mut sim = pair();
    let (_x, k) = fmr_valid(&mut sim, 4, 0, LW | RW);
    post(&mut sim, A, QA, local_inv(1, k.inc()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocQpOpErr]);
}

#[test]
fn a8_local_inv_with_bound_type2_mw_is_loc_qp_op_err() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 4, 0, LW | RW | RR | Access::MW_BIND);
    let iova = x.iova(&sim, A);
    let mw = sim.nodes[A].mem.table().alloc_mw(PD, MwType::Type2).unwrap();
    let bind = SendOp::BindMw { mw, new_key: mw.inc(), mr: k, addr: iova, len: 4096, access: RW | RR };
    post(&mut sim, A, QA, SendWqe::new(1, bind).flags(sig()));
    post(&mut sim, A, QA, local_inv(2, k));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success, WcStatus::LocQpOpErr]);
}

#[test]
fn a9_local_inv_of_user_mr_is_loc_qp_op_err() {
    let mut sim = pair();
    let u = reg(&sim, A, 4096, ALL);
    post(&mut sim, A, QA, local_inv(1, u.key));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocQpOpErr]);
}

#[test]
fn a10_reregister_without_remap() {
    let mut sim = pair();
    let (x, k1) = fmr_valid(&mut sim, 4, 0, LW | RW);
    let iova = x.iova(&sim, A);
    let k2 = k1.inc();
    post(&mut sim, A, QA, local_inv(1, k1));
    post(&mut sim, A, QA, reg_mr(2, k1, k2, LW | RW));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
    let b = reg(&sim, B, 4096, ALL);
    b.write(0, &pattern(64, 1));
    post(&mut sim, B, QB, write(3, &b, 0, 64, iova + 10, k2.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success]);
    assert_eq!(x.read(10, 64), pattern(64, 1));
}

#[test]
fn a11_remap_while_valid_uses_staging() {
    let mut sim = pair();
    let (x, k1) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 4096, ALL);
    b.write(0, &[0xAA; 32]);
    // Stage new pages while X is VALID.
    let r2 = Region::zeroed(3 * 4096);
    let off2 = ((4096 - r2.addr() % 4096) % 4096) as usize;
    sim.nodes[A].mem.table().map_mr_sg(k1, &[SgEntry { region: &r2, offset: off2, len: 4096 }], 0, 4096).unwrap();
    post(&mut sim, B, QB, write(1, &b, 0, 32, iova, k1.0));
    drive(&mut sim);
    assert_eq!(x.read(0, 32), vec![0xAA; 32], "k1 writes land in the old pages");
    let k2 = k1.inc();
    post(&mut sim, A, QA, local_inv(2, k1));
    post(&mut sim, A, QA, reg_mr(3, k1, k2, LW | RW));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
    let iova2 = sim.nodes[A].mem.table().query(k2).unwrap().next_iova;
    b.write(0, &[0xBB; 32]);
    post(&mut sim, B, QB, write(4, &b, 0, 32, iova2, k2.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success; 2]);
    let mut v = vec![0u8; 32];
    r2.read(off2, &mut v).unwrap();
    assert_eq!(v, vec![0xBB; 32], "k2 writes land in the new pages");
    assert_eq!(x.read(0, 32), vec![0xAA; 32]);
}

#[test]
fn a12_iova_upper_bits_rewrite() {
    let mut sim = pair();
    let first_off = 0x80;
    let x = fmr(&sim, A, 4, first_off);
    let iova = x.iova(&sim, A);
    let new_iova = (0xABCD_u64 << 32) | (iova & 0xFFFF_FFFF);
    let k = x.key.inc();
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::RegMr { mr: x.key, key: k, access: LW | RW, iova: Some(new_iova), length: None }).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let b = reg(&sim, B, 4096, ALL);
    b.write(0, &pattern(100, 5));
    post(&mut sim, B, QB, write(2, &b, 0, 100, new_iova + 5000, k.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success]);
    // page 1, offset 5000 - 4096 + first-SG offset
    assert_eq!(x.read(4096 + (5000 - 4096) + first_off, 100), pattern(100, 5));
}

#[test]
fn a13_range_violations_nak_remote_access() {
    for case in 0..3 {
        let mut sim = pair();
        let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RW | RR);
        let iova = x.iova(&sim, A);
        let len = sim.nodes[A].mem.table().query(k).unwrap().next_length;
        let b = reg(&sim, B, 8192, ALL);
        let w = match case {
            0 => write(1, &b, 0, 10, iova + len - 9, k.0),
            1 => read(1, &b, 0, 10, iova - 1, k.0),
            _ => write(1, &b, 0, 10, u64::MAX - 4, k.0),
        };
        post(&mut sim, B, QB, w);
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemAccessErr], "case {case}");
        assert_eq!(x.read(0, 4096), vec![0; 4096], "nothing written (case {case})");
    }
}

#[test]
fn a14_remote_read_only_mr_rejects_write() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RR);
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, B, QB, write(1, &b, 0, 10, iova, k.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemAccessErr]);
}

#[test]
fn a15_remote_write_without_local_write_is_loc_qp_op_err() {
    let mut sim = pair();
    let x = fmr(&sim, A, 1, 0);
    post(&mut sim, A, QA, reg_mr(1, x.key, x.key.inc(), RW));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocQpOpErr]);
}

#[test]
fn a16_zero_length_write_and_read_need_no_key() {
    let mut sim = pair();
    post(&mut sim, B, QB, SendWqe::new(1, SendOp::Write).remote(0, 0).flags(sig()));
    post(&mut sim, B, QB, SendWqe::new(2, SendOp::Read).remote(0, 0).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success; 2]);
}

// ---------------------------------------------------------------- B. Remote invalidation

#[test]
fn b1_send_with_invalidate() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RW | RR);
    let iova = x.iova(&sim, A);
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    post_recv(&mut sim, A, QA, recv(7, &a, 0, 1000));
    post(&mut sim, B, QB, SendWqe::new(1, SendOp::SendInv(k.0)).sge(b.sge(0, 16)).flags(sig()));
    drive(&mut sim);
    let r = recv_cqes(&mut sim, A, QA);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, WcStatus::Success);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r[0].invalidated_rkey, Some(k.0));
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
    post(&mut sim, B, QB, write(2, &b, 0, 8, iova, k.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success, WcStatus::RemAccessErr]);
}

/// B2: invalid IETH key. Receiver: REM_INV_REQ_ERR, QP → ERR. We NAK 0x61 (Invalid
/// Request), so the sender sees REM_INV_REQ_ERR rather than rxe's apparent ACK (§2.7).
#[test]
fn b2_send_with_invalidate_wrong_key() {
    let mut sim = pair();
    let (_x, k) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let a = reg(&sim, A, 4096, ALL);
    post_recv(&mut sim, A, QA, recv(7, &a, 0, 1000));
    post(&mut sim, B, QB, SendWqe::new(1, SendOp::SendInv(k.inc().0)).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&recv_cqes(&mut sim, A, QA)), vec![WcStatus::RemInvReqErr]);
    assert_eq!(st(&sim, A, QA), QpState::Err);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemInvReqErr]);
}

#[test]
fn b3_multi_packet_send_with_inv_retried_invalidates_once() {
    let mut sim = pair();
    let (_x, k) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    b.write(0, &pattern(3072, 2));
    post_recv(&mut sim, A, QA, recv(7, &a, 0, 4096));
    let mut once = true;
    sim.add_filter(move |p| (p.from == B && p.is_request() && p.psn == 101 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, B, QB, SendWqe::new(1, SendOp::SendInv(k.0)).sge(b.sge(0, 3072)).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success]);
    let r = recv_cqes(&mut sim, A, QA);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].invalidated_rkey, Some(k.0));
    assert_eq!(a.read(0, 3072), pattern(3072, 2));
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
    assert!(stats(&sim, B, QB).retries >= 1);
}

/// B4 (hazard, IBA 9.4.1.1.1): READ of X then SEND_WITH_INV(X) *without* fence. In our engine
/// the responder executes the SEND_WITH_INV as soon as it arrives, before it generates the
/// READ responses (both arrive back to back), so the rkey recheck of the READ responses fails:
/// the READ completes REM_ACCESS_ERR. Deterministic here; on a real wire it depends on timing —
/// the consumer must fence (B5).
#[test]
fn b4_unfenced_send_inv_after_read_is_a_hazard() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 2, 0, LW | RW | RR);
    let iova = x.iova(&sim, A);
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 16384, ALL);
    post_recv(&mut sim, A, QA, recv(7, &a, 0, 1000));
    let mut n = 0;
    sim.add_filter(move |p| {
        if p.from == A && p.opcode.info().is_some_and(|i| i.kind == pmrxe_wire::OpKind::ReadResponse) {
            n += 1;
            if n == 3 {
                return Some(Fault::Drop);
            }
        }
        None
    });
    post(&mut sim, B, QB, read(1, &b, 0, 8192, iova, k.0));
    post(&mut sim, B, QB, SendWqe::new(2, SendOp::SendInv(k.0)).flags(sig()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, B, QB);
    assert_eq!(c[0].status, WcStatus::RemAccessErr, "{c:?}");
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
}

#[test]
fn b5_fenced_send_inv_after_read() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 2, 0, LW | RW | RR);
    let iova = x.iova(&sim, A);
    x.region.write(x.base_off, &pattern(8192, 6)).unwrap();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 16384, ALL);
    post_recv(&mut sim, A, QA, recv(7, &a, 0, 1000));
    let mut n = 0;
    sim.add_filter(move |p| {
        if p.from == A && p.opcode.info().is_some_and(|i| i.kind == pmrxe_wire::OpKind::ReadResponse) {
            n += 1;
            if n == 3 {
                return Some(Fault::Drop);
            }
        }
        None
    });
    post(&mut sim, B, QB, read(1, &b, 0, 8192, iova, k.0));
    post(&mut sim, B, QB, SendWqe::new(2, SendOp::SendInv(k.0)).flags(sig() | SendFlags::FENCE));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success; 2]);
    assert_eq!(b.read(0, 8192), pattern(8192, 6));
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
}

// ---------------------------------------------------------------- C. Fences and local ordering

fn first_time(sim: &Sim, f: impl Fn(&pmrxe_transport::sim::PacketInfo) -> bool) -> Instant {
    sim.trace.iter().find(|p| f(p)).expect("packet").time
}

#[test]
fn c1_fence_waits_for_read_data_placement() {
    let mut sim = pair();
    let a = reg(&sim, A, 128 * 1024, ALL);
    let b = reg(&sim, B, 128 * 1024, ALL);
    b.write(0, &pattern(65536, 8));
    post_recv(&mut sim, B, QB, recv(5, &b, 100_000, 100));
    sim.add_filter(|p| (p.from == B && p.opcode.info().is_some_and(|i| i.kind == pmrxe_wire::OpKind::ReadResponse)).then_some(Fault::Delay(5 * MS)));
    post(&mut sim, A, QA, read(1, &a, 0, 65536, b.addr, b.rkey()));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::Send).flags(sig() | SendFlags::FENCE));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
    let last_resp = sim.trace.iter().filter(|p| p.from == B && p.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST).map(|p| p.time).max().unwrap();
    let arrival = Instant(last_resp.0 + 5 * MS + sim.latency_ns);
    let send_t = first_time(&sim, |p| p.from == A && p.opcode == Opcode::RC_SEND_ONLY);
    assert!(send_t >= arrival, "SEND at {send_t:?} before READ data placed at {arrival:?}");
    assert_eq!(a.read(0, 65536), pattern(65536, 8));
}

/// C2: FENCE covers only READ/ATOMIC. With a 1 MiB WRITE ahead, the fenced SEND leaves at
/// exactly the same time as an unfenced one (only the 128-PSN window paces it), i.e. it does
/// not wait for the WRITE's ACK.
#[test]
fn c2_fence_does_not_wait_for_write_ack() {
    let mut times = vec![];
    for flags in [sig(), sig() | SendFlags::FENCE] {
        let mut sim = pair();
        let a = reg(&sim, A, 1 << 20, ALL);
        let b = reg(&sim, B, 1 << 20, ALL);
        post_recv(&mut sim, B, QB, recv(5, &b, 0, 100));
        post(&mut sim, A, QA, write(1, &a, 0, 1 << 20, b.addr, b.rkey()));
        post(&mut sim, A, QA, SendWqe::new(2, SendOp::Send).flags(flags));
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
        times.push(first_time(&sim, |p| p.opcode == Opcode::RC_SEND_ONLY));
    }
    assert_eq!(times[0], times[1]);
}

#[test]
fn c3_local_inv_waits_for_earlier_write_ack() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 16, 0, LW | RW | RR);
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 1 << 16, ALL);
    sim.add_filter(|p| (p.from == B && p.opcode == Opcode::RC_ACKNOWLEDGE).then_some(Fault::Delay(MS)));
    let src = pmrxe_mem::Sge { addr: iova, len: 65536, lkey: k };
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Write).sge(src).remote(b.addr, b.rkey()).flags(sig()));
    post(&mut sim, A, QA, local_inv(2, k));
    // After the WRITE is fully sent but before its ACK, X must still be VALID.
    sim.drive_until(STEPS, |s| s.trace.iter().any(|p| p.opcode == Opcode::RC_RDMA_WRITE_LAST));
    assert_eq!(mr_state(&sim, A, k), MrState::Valid);
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![1, 2]);
    assert_eq!(statuses(&c), vec![WcStatus::Success; 2]);
    assert_eq!(mr_state(&sim, A, k), MrState::Free);
}

#[test]
fn c4_unsignaled_reg_mr_then_fenced_send_no_deadlock() {
    let mut sim = pair();
    let x = fmr(&sim, A, 1, 0);
    let k2 = x.key.inc();
    let b = reg(&sim, B, 4096, ALL);
    post_recv(&mut sim, B, QB, recv(5, &b, 0, 100));
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::RegMr { mr: x.key, key: k2, access: LW | RW, iova: None, length: None }));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::SendImm(k2.0)).flags(sig() | SendFlags::FENCE));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![2]);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(recv_cqes(&mut sim, B, QB)[0].imm_data, Some(k2.0));
}

#[test]
fn c5_reg_mr_visible_to_next_wqe() {
    let mut sim = pair();
    let x = fmr(&sim, A, 1, 0);
    let k2 = x.key.inc();
    x.region.write(x.base_off, &pattern(100, 3)).unwrap();
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, reg_mr(1, x.key, k2, LW | RW));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::Write).sge(pmrxe_mem::Sge { addr: iova, len: 100, lkey: k2 }).remote(b.addr, b.rkey()).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
    assert_eq!(b.read(0, 100), pattern(100, 3));
}

#[test]
fn c6_write_with_invalidated_lkey_is_loc_prot_err() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let iova = x.iova(&sim, A);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, local_inv(1, k));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::Write).sge(pmrxe_mem::Sge { addr: iova, len: 10, lkey: k }).remote(b.addr, b.rkey()).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success, WcStatus::LocProtErr]);
}

#[test]
fn c7_local_op_cqe_after_earlier_write_cqe() {
    let mut sim = pair();
    let x = fmr(&sim, A, 1, 0);
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    sim.add_filter(|p| (p.from == B && p.opcode == Opcode::RC_ACKNOWLEDGE).then_some(Fault::Delay(MS)));
    post(&mut sim, A, QA, write(1, &a, 0, 100, b.addr, b.rkey()));
    post(&mut sim, A, QA, reg_mr(2, x.key, x.key.inc(), LW));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![1, 2]);
    assert_eq!(statuses(&c), vec![WcStatus::Success; 2]);
}

#[test]
fn c8_rd_atomic_credit_of_one() {
    let p = PairParams { max_rd_atomic: 1, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    post_recv(&mut sim, B, QB, recv(5, &b, 0, 100));
    post(&mut sim, A, QA, read(1, &a, 0, 2048, b.addr, b.rkey()));
    post(&mut sim, A, QA, read(2, &a, 2048, 2048, b.addr, b.rkey()));
    post(&mut sim, A, QA, SendWqe::new(3, SendOp::Send).flags(sig() | SendFlags::FENCE));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    let reqs: Vec<_> = sim.trace.iter().filter(|p| p.opcode == Opcode::RC_RDMA_READ_REQUEST).collect();
    let last_resp: Vec<_> = sim.trace.iter().filter(|p| p.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST).collect();
    assert!(reqs[1].time >= Instant(last_resp[0].time.0 + sim.latency_ns));
    let send_t = first_time(&sim, |p| p.opcode == Opcode::RC_SEND_ONLY);
    assert!(send_t >= Instant(last_resp[1].time.0 + sim.latency_ns));
}

// ---------------------------------------------------------------- D. Retry and local operations

#[test]
fn d1_retry_does_not_replay_reg_mr() {
    let mut sim = pair();
    let x = fmr(&sim, A, 1, 0);
    let k2 = x.key.inc();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    a.write(0, &pattern(4096, 1));
    post_recv(&mut sim, B, QB, recv(5, &b, 5000, 100));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 101 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 4096, b.addr, b.rkey()));
    post(&mut sim, A, QA, reg_mr(2, x.key, k2, LW | RW));
    post(&mut sim, A, QA, SendWqe::new(3, SendOp::SendImm(k2.0)).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    let s = stats(&sim, A, QA);
    assert_eq!(s.local_op_executions, 1);
    assert_eq!(s.local_op_reexecutions, 0);
    assert!(s.retries >= 1 && s.retransmits >= 3, "{s:?}");
    assert!(s.local_op_replay_skips >= 1);
    assert_eq!(b.read(0, 4096), pattern(4096, 1));
}

#[test]
fn d2_retry_does_not_replay_bind_mw() {
    let mut sim = pair();
    let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RW | RR | Access::MW_BIND);
    let iova = x.iova(&sim, A);
    let mw = sim.nodes[A].mem.table().alloc_mw(PD, MwType::Type2).unwrap();
    let wk = mw.inc();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    post_recv(&mut sim, B, QB, recv(5, &b, 5000, 100));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 102 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 4096, b.addr, b.rkey()));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::BindMw { mw, new_key: wk, mr: k, addr: iova, len: 4096, access: RW | RR }).flags(sig()));
    post(&mut sim, A, QA, SendWqe::new(3, SendOp::SendImm(wk.0)).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    assert_eq!(stats(&sim, A, QA).local_op_executions, 2); // REG_MR (setup) + BIND_MW
    b.write(0, &pattern(64, 9));
    post(&mut sim, B, QB, write(4, &b, 0, 64, iova + 100, wk.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::Success]);
    assert_eq!(x.read(100, 64), pattern(64, 9));
}

#[test]
fn d2b_local_inv_then_reg_mr_with_retry() {
    let mut sim = pair();
    let (y, k1) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let iova = y.iova(&sim, A);
    let k2 = k1.inc();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 16384, ALL);
    y.region.write(y.base_off, &pattern(500, 4)).unwrap();
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 101 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 4096, b.addr, b.rkey()));
    post(&mut sim, A, QA, local_inv(2, k1));
    post(&mut sim, A, QA, reg_mr(3, k1, k2, LW | RW));
    post(&mut sim, A, QA, SendWqe::new(4, SendOp::Write).sge(pmrxe_mem::Sge { addr: iova, len: 500, lkey: k2 }).remote(b.addr + 8192, b.rkey()).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 4]);
    assert_eq!(stats(&sim, A, QA).local_op_executions, 3);
    assert_eq!(b.read(8192, 500), pattern(500, 4));
}

#[test]
fn d3_spurious_timer_never_reexecutes_local_ops() {
    let p = PairParams { timeout: 1, ..Default::default() };
    let mut sim = pair_with(&p, 3);
    sim.latency_ns = 6_000; // RTT 12 µs > 8.192 µs: every message sees a spurious timeout
    sim.record = false;
    let x = fmr(&sim, A, 1, 0);
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    let mut key = x.key;
    let xiova = x.iova(&sim, A);
    let iters = 1000;
    for i in 0..iters {
        post_recv(&mut sim, B, QB, recv(i, &b, 0, 64));
        let nk = key.inc();
        post(&mut sim, A, QA, reg_mr(i * 4, key, nk, LW | RW));
        post(&mut sim, A, QA, SendWqe::new(i * 4 + 1, SendOp::Send).sge(pmrxe_mem::Sge { addr: xiova, len: 64, lkey: nk }).flags(sig()));
        post(&mut sim, A, QA, write(i * 4 + 2, &a, 0, 2048, b.addr + 1024, b.rkey()));
        post(&mut sim, A, QA, local_inv(i * 4 + 3, nk));
        key = nk;
        drive(&mut sim);
        let c = send_cqes(&mut sim, A, QA);
        assert_eq!(statuses(&c), vec![WcStatus::Success; 4], "iteration {i}");
    }
    let s = stats(&sim, A, QA);
    assert!(s.retries > 0, "no spurious retries happened: {s:?}");
    assert_eq!(s.local_op_executions, 2 * iters);
    assert_eq!(s.local_op_reexecutions, 0);
}

/// D4: the consumer (incorrectly) changes the source buffer before a retransmission. Packets
/// are rebuilt from the current memory (a pure function of WQE and PSN offset), so the
/// retransmitted packets carry the new bytes; the first, acknowledged packet keeps the old.
#[test]
fn d4_retransmission_gathers_current_bytes() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    a.write(0, &[1u8; 3072]);
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 101 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 3072, b.addr, b.rkey()));
    sim.step();
    a.write(0, &[2u8; 3072]);
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert_eq!(b.read(0, 1024), vec![1u8; 1024]);
    assert_eq!(b.read(1024, 2048), vec![2u8; 2048]);
}

#[test]
fn d5_partial_read_retry_requests_the_rest() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    b.write(0, &pattern(8192, 5));
    let mut once = true;
    sim.add_filter(move |p| (p.from == B && p.psn == 104 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, read(1, &a, 0, 8192, b.addr, b.rkey()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&c), vec![WcStatus::Success]);
    assert_eq!(a.read(0, 8192), pattern(8192, 5));
    let reqs: Vec<u32> = sim.trace.iter().filter(|p| p.opcode == Opcode::RC_RDMA_READ_REQUEST).map(|p| p.psn).collect();
    assert_eq!(reqs, vec![100, 104]);
    let replay_first = sim.trace.iter().filter(|p| p.from == B && p.psn == 104).nth(1).unwrap();
    assert_eq!(replay_first.opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
}

#[test]
fn d6_duplicate_write_is_reacked_not_rewritten() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    let mut once = true;
    sim.add_filter(move |p| (p.from == B && p.opcode == Opcode::RC_ACKNOWLEDGE && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 2048, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let s = stats(&sim, B, QB);
    assert!(s.duplicates >= 1);
    assert_eq!(s.resp_bytes_written, 2048, "duplicate rewrote memory");
    assert!(stats(&sim, A, QA).timeouts >= 1);
}

#[test]
fn d7_duplicate_fetch_add_returns_saved_value() {
    let mut sim = pair();
    let a = reg(&sim, A, 64, ALL);
    let b = reg(&sim, B, 64, ALL);
    b.write(0, &40u64.to_le_bytes());
    let mut once = true;
    sim.add_filter(move |p| (p.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::FetchAdd { add: 2 }).sge(a.sge(0, 8)).remote(b.addr, b.rkey()).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert_eq!(a.u64_at(0), 40);
    assert_eq!(b.u64_at(0), 42);
    assert_eq!(stats(&sim, B, QB).atomic_replays, 1);
}

// ---------------------------------------------------------------- E. Error and flush

#[test]
fn e1_remote_access_error_then_flush() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    for i in 0..3 {
        post_recv(&mut sim, B, QB, recv(50 + i, &b, 0, 100));
    }
    post(&mut sim, A, QA, send(1, &a, 0, 10));
    post(&mut sim, A, QA, write(2, &a, 0, 10, b.addr, b.rkey() ^ 0x80));
    post(&mut sim, A, QA, send(3, &a, 0, 10));
    post(&mut sim, A, QA, send(4, &a, 0, 10));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success, WcStatus::RemAccessErr, WcStatus::WrFlushErr, WcStatus::WrFlushErr]);
    assert_eq!(st(&sim, B, QB), QpState::Err);
}

#[test]
fn e2_unsignaled_failing_wr_still_completes() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Write).sge(a.sge(0, 10)).remote(b.addr, 0xdead));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![1]);
    assert_eq!(c[0].status, WcStatus::RemAccessErr);
}

#[test]
fn e3_failing_local_op_reports_real_status() {
    // A failing LOCAL_INV (wrong key) behind a successful WRITE: the failing WR carries
    // LOC_QP_OP_ERR (not WR_FLUSH_ERR), the next one is flushed.
    let mut sim = pair();
    let (_x, k) = fmr_valid(&mut sim, 1, 0, LW | RW);
    let a = reg(&sim, A, 64, ALL);
    let b = reg(&sim, B, 64, ALL);
    post(&mut sim, A, QA, write(1, &a, 0, 8, b.addr, b.rkey()));
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::LocalInv { key: k.inc() }));
    post(&mut sim, A, QA, write(3, &a, 0, 8, b.addr, b.rkey()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![1, 2, 3]);
    assert_eq!(statuses(&c), vec![WcStatus::Success, WcStatus::LocQpOpErr, WcStatus::WrFlushErr]);
}

#[test]
fn e5_send_longer_than_receive_buffer() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    post_recv(&mut sim, B, QB, recv(9, &b, 0, 100));
    post(&mut sim, A, QA, send(1, &a, 0, 200));
    drive(&mut sim);
    assert_eq!(statuses(&recv_cqes(&mut sim, B, QB)), vec![WcStatus::LocLenErr]);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RemInvReqErr]);
}

#[test]
fn e6_rnr_retry_exhausted_with_spacing() {
    let p = PairParams { rnr_retry: 2, min_rnr_timer: 1, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Send).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RnrRetryExcErr]);
    let sends: Vec<Instant> = sim.trace.iter().filter(|p| p.opcode == Opcode::RC_SEND_ONLY).map(|p| p.time).collect();
    assert_eq!(sends.len(), 3, "original + 2 retries");
    for w in sends.windows(2) {
        assert!(w[1].0 - w[0].0 >= 10_000, "retries {w:?} closer than 0.01 ms");
    }
    assert!(sim.trace.iter().any(|p| p.syndrome == Some(Syndrome::RnrNak { timer: 1 })));
}

#[test]
fn e7_infinite_rnr_retry_succeeds_when_receive_posted() {
    let p = PairParams { rnr_retry: 7, min_rnr_timer: 14, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    sim.record = false;
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Send).flags(sig()));
    sim.drive_until(STEPS, |s| s.now >= Instant(50 * MS));
    post_recv(&mut sim, B, QB, recv(2, &b, 0, 10));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert!(stats(&sim, A, QA).rnr_naks_received > 10);
}

fn silent_peer(retry: u8, timeout: u8) -> (Sim, Vec<Instant>) {
    let p = PairParams { retry_cnt: retry, timeout, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    sim.add_filter(|p| (p.from == A).then_some(Fault::Drop));
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, write(1, &a, 0, 10, b.addr, b.rkey()));
    let _ = sim.drive(STEPS);
    let t = sim.trace.iter().filter(|p| p.from == A).map(|p| p.time).collect();
    (sim, t)
}

/// Gaps between consecutive times, in ns.
fn gaps(t: &[Instant]) -> Vec<u64> {
    t.windows(2).map(|w| w[1].0 - w[0].0).collect()
}

/// E8 with pmrxe's retransmission back-off (a deviation from SEMANTICS.md's "about 67 ms
/// apart", within IBA's range for the actual timer: the computed value to 4 × it): the count
/// is unchanged (3 retransmissions, then RETRY_EXC_ERR on the 4th timeout), the period doubles
/// per consecutive timeout up to 4 × (67, 134, 268 ms, then 268 ms before the failure), and
/// the time in back-off is counted.
#[test]
fn e8_retry_exhausted_after_three_retransmissions() {
    let (mut sim, t) = silent_peer(3, 14);
    assert_eq!(t.len(), 4, "original + exactly 3 retransmissions");
    let tmo = 4096u64 << 14;
    assert_eq!(gaps(&t), vec![tmo, 2 * tmo, 4 * tmo], "67.1 ms, then doubling");
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&c), vec![WcStatus::RetryExcErr]);
    assert_eq!(sim.now.0 - t[3].0, 4 * tmo);
    let s = stats(&sim, A, QA);
    assert_eq!((s.timeouts, s.retries, s.retry_exceeded), (4, 3, 1));
    assert_eq!(s.backoff_ns, sim.now.0 - t[1].0, "in back-off from the first timeout to the failure");
}

/// E9: 7 retransmissions; the back-off stops doubling at 4 × the local ACK timeout.
#[test]
fn e9_retry_cnt_seven_means_seven() {
    let (mut sim, t) = silent_peer(7, 10);
    assert_eq!(t.len(), 8);
    let tmo = 4096u64 << 10;
    assert_eq!(gaps(&t), vec![tmo, 2 * tmo, 4 * tmo, 4 * tmo, 4 * tmo, 4 * tmo, 4 * tmo]);
    assert_eq!(sim.now.0 - t[7].0, 4 * tmo);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RetryExcErr]);
}

/// E8 at the top of the 5-bit encoding: the backed-off period never exceeds 4.096 µs × 2^31.
#[test]
fn e8_backoff_never_exceeds_the_largest_encodable_timeout() {
    let (mut sim, t) = silent_peer(3, 30);
    let tmo = 4096u64 << 30;
    assert_eq!(gaps(&t), vec![tmo, 2 * tmo, 2 * tmo]);
    assert_eq!(sim.now.0 - t[3].0, 2 * tmo);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RetryExcErr]);
}

/// E8 variant: forward progress ends the back-off. A WRITE whose first transmission is lost
/// is resent after one timeout (back-off now 2×); its ACK resets the timer, so the next
/// WRITE's loss is again detected after the nominal period, not after the backed-off one.
#[test]
fn e8_backoff_resets_on_forward_progress() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    a.write(0, &pattern(100, 5));
    let mut drops = 0;
    sim.add_filter(move |p| {
        // Drop the first transmission of each WRITE (PSN 100 and 101) once.
        (p.from == A && p.opcode == Opcode::RC_RDMA_WRITE_ONLY && drops < 2 && p.psn == 100 + drops).then(|| {
            drops += 1;
            Fault::Drop
        })
    });
    post(&mut sim, A, QA, write(1, &a, 0, 50, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let s1 = stats(&sim, A, QA);
    assert_eq!(s1.timeouts, 1);
    // In back-off from the timeout until the retransmission's ACK: one round trip.
    assert_eq!(s1.backoff_ns, 2 * sim.latency_ns);
    post(&mut sim, A, QA, write(2, &a, 50, 50, b.addr + 50, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let w2: Vec<Instant> = sim.trace.iter().filter(|p| p.from == A && p.psn == 101).map(|p| p.time).collect();
    assert_eq!(gaps(&w2), vec![4096 << 14], "nominal period again after progress");
    assert_eq!(stats(&sim, A, QA).timeouts, 2);
    assert_eq!(b.read(0, 100), pattern(100, 5));
}

/// E8 variant (no amplification): in back-off the go-back-N resends one probe of 16 packets,
/// not the whole window; its ACK ends the back-off and the rest follows. A 32-packet WRITE whose
/// every first transmission is lost: 32 sent, timeout, 16 resent (the 16th asks for the ACK),
/// then the other 16.
#[test]
fn e8_backoff_resends_one_probe_not_the_window() {
    let mut sim = pair();
    let a = reg(&sim, A, 32768, ALL);
    let b = reg(&sim, B, 32768, ALL);
    a.write(0, &pattern(32768, 9));
    let mut seen = std::collections::HashSet::new();
    sim.add_filter(move |p| (p.from == A && p.is_request() && seen.insert(p.psn)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 32768, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert_eq!(b.read(0, 32768), pattern(32768, 9));
    let sent: Vec<(Instant, u32, bool)> = sim.trace.iter().filter(|p| p.from == A).map(|p| (p.time, p.psn, p.ack_req)).collect();
    assert_eq!(sent.len(), 32 + 16 + 16);
    let probe = &sent[32..48];
    assert!(probe.iter().all(|&(t, ..)| t == probe[0].0), "the probe leaves at the timeout");
    assert_eq!(probe.iter().map(|&(_, psn, _)| psn).collect::<Vec<_>>(), (100..116).collect::<Vec<_>>());
    assert!(probe[15].2, "the probe's last packet asks for the ACK");
    assert!(sent[48].0 > probe[0].0, "the rest waits for the probe's ACK");
    let s = stats(&sim, A, QA);
    assert_eq!((s.timeouts, s.retransmits), (1, 32));
    assert_eq!(s.backoff_ns, 2 * sim.latency_ns);
}

/// SEMANTICS.md §5.4 (no amplification): a storm of PSN sequence NAKs restarts go-back-N once
/// per round trip. After the restart from the NAKed PSN, 50 more NAKs for it arrive before the
/// retransmission is acknowledged: none restarts the window again, nothing is sent twice more.
#[test]
fn e_nak_storm_restarts_go_back_n_once_per_round_trip() {
    let mut sim = pair();
    let a = reg(&sim, A, 16384, ALL);
    let b = reg(&sim, B, 16384, ALL);
    a.write(0, &pattern(16384, 7));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 102 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 16384, b.addr, b.rkey()));
    assert!(sim.drive_until(STEPS, |s| stats(s, A, QA).seq_naks_received == 1));
    assert_eq!(stats(&sim, A, QA).retries, 1);
    let nak = TransportHeaders {
        aeth: Some(pmrxe_wire::AethRepr { syndrome: Syndrome::Nak(NakCode::PsnSeqErr), msn: pmrxe_wire::Msn::new(0) }),
        ..TransportHeaders::new(BthRepr { dest_qp: Qpn::new(QA), ..bth(Opcode::RC_ACKNOWLEDGE, 102) })
    };
    for _ in 0..50 {
        let now = sim.now;
        let n = &mut sim.nodes[A];
        n.handle_packet(now, &RxPacket::new(nak, &[]));
    }
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let s = stats(&sim, A, QA);
    assert_eq!(s.seq_naks_received, 51);
    assert_eq!(s.retries, 1, "one go-back-N restart for the whole storm");
    assert_eq!(s.timeouts, 0);
    // 16 packets + one go-back-N from PSN 102 (14 packets), nothing more.
    assert_eq!(sim.trace.iter().filter(|p| p.from == A).count(), 16 + 14);
    assert_eq!(b.read(0, 16384), pattern(16384, 7));
}

#[test]
fn e10_timeout_zero_never_retransmits() {
    let (mut sim, t) = silent_peer(3, 0);
    assert_eq!(t.len(), 1);
    assert!(send_cqes(&mut sim, A, QA).is_empty(), "the WR stays outstanding");
    assert_eq!(st(&sim, A, QA), QpState::Rts);
}

fn raw_to_b(sim: &mut Sim, hdr: TransportHeaders, payload: &[u8]) -> Vec<TransportHeaders> {
    let now = sim.now;
    let node = &mut sim.nodes[B];
    let pkt = RxPacket::new(hdr, payload);
    node.handle_packet(now, &pkt);
    let mut sent = vec![];
    node.transmit(now, usize::MAX, 32, &mut sent);
    sent.iter().map(|o| TransportHeaders::parse(&o.roce[..o.t.len]).unwrap().0).collect()
}

fn bth(op: Opcode, psn: u32) -> BthRepr {
    BthRepr { opcode: op, solicited: false, migreq: true, pad: 0, tver: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: Qpn::new(QB), ack_req: true, psn: Psn::new(psn) }
}

#[test]
fn e11_misaligned_atomic() {
    let mut sim = pair();
    let a = reg(&sim, A, 64, ALL);
    let b = reg(&sim, B, 64, ALL);
    // Requester side: rejected at post time (as rxe), no CQE.
    let w = SendWqe::new(1, SendOp::FetchAdd { add: 1 }).sge(a.sge(0, 8)).remote(b.addr + 4, b.rkey()).flags(sig());
    assert_eq!(sim.nodes[A].post_send(QA, Instant(0), w), Err(pmrxe_transport::PostError::BadAtomic));
    // Responder side: NAK 0x61.
    let mut h = TransportHeaders::new(bth(Opcode::RC_FETCH_ADD, 100));
    h.atomic_eth = Some(AtomicEthRepr { va: b.addr + 4, rkey: b.rkey(), swap_add: 1, compare: 0 });
    let out = raw_to_b(&mut sim, h, &[]);
    assert_eq!(out.last().unwrap().aeth.unwrap().syndrome, Syndrome::Nak(NakCode::InvalidRequest));
}

#[test]
fn e12_nak_mid_read_response_ends_in_error() {
    let mut sim = pair();
    sim.max_burst = 1;
    let a = reg(&sim, A, 8192, ALL);
    // X lives on B here.
    let x = fmr(&sim, B, 2, 0);
    let k = x.key.inc();
    post(&mut sim, B, QB, reg_mr(1, x.key, k, LW | RR));
    drive(&mut sim);
    let iova = x.iova(&sim, B);
    post(&mut sim, A, QA, read(2, &a, 0, 8192, iova, k.0));
    sim.drive_until(STEPS, |s| s.trace.iter().filter(|p| p.from == B && p.opcode.info().is_some_and(|i| i.kind == pmrxe_wire::OpKind::ReadResponse)).count() >= 3);
    sim.nodes[B].mem.table().exec_local_inv(PD, k).unwrap();
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RemAccessErr]);
    let s = stats(&sim, A, QA);
    assert!(s.retries <= 1, "no retry loop: {s:?}");
}

/// E12 for a WRITE: B invalidates the target MR after 3 of an 8-packet WRITE's packets are
/// placed. The responder carries the translation validated at FIRST across the message's
/// packets (`pmrxe_mem::Translation`); the invalidation must end that: the 4th packet is
/// checked again, NAKed 0x62, and nothing lands past the packets placed before it.
#[test]
fn e12_invalidate_mid_write_message_naks_the_rest() {
    let mut sim = pair();
    sim.max_burst = 1;
    let a = reg(&sim, A, 8192, ALL);
    a.write(0, &pattern(8192, 5));
    let x = fmr(&sim, B, 2, 0);
    let k = x.key.inc();
    post(&mut sim, B, QB, reg_mr(1, x.key, k, LW | RW));
    drive(&mut sim);
    let iova = x.iova(&sim, B);
    // The WRITE's packets from the 4th on arrive 1 ms late: the invalidation lands between.
    let mut n = 0;
    sim.add_filter(move |p| {
        let write = p.from == A && p.opcode.info().is_some_and(|i| i.kind == pmrxe_wire::OpKind::Write);
        n += usize::from(write);
        (write && n > 3).then_some(Fault::Delay(MS))
    });
    post(&mut sim, A, QA, write(2, &a, 0, 8192, iova, k.0));
    assert!(sim.drive_until(STEPS, |s| stats(s, B, QB).resp_bytes_written >= 3 * 1024));
    let placed = stats(&sim, B, QB).resp_bytes_written as usize;
    assert!(placed < 8192, "the whole message landed before the invalidation: {placed}");
    sim.nodes[B].mem.table().exec_local_inv(PD, k).unwrap();
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RemAccessErr]);
    assert_eq!(stats(&sim, B, QB).resp_bytes_written as usize, placed, "a packet was placed after the invalidation");
    assert_eq!(x.read(0, placed), pattern(8192, 5)[..placed].to_vec());
    assert!(x.read(placed, 8192 - placed).iter().all(|&b| b == 0), "bytes past the invalidation point landed");
    assert!(stats(&sim, B, QB).rkey_violations >= 1);
    assert_eq!(st(&sim, B, QB), QpState::Err);
}

// ---------------------------------------------------------------- F. Wire format

/// F1: ICRC golden vectors are pmrxe-wire's tests; here every frame of a clean run crosses as
/// bytes and passes `parse_frame`'s ICRC check.
#[test]
fn f1_every_sim_frame_passes_icrc() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    post_recv(&mut sim, B, QB, recv(1, &b, 0, 4096));
    post(&mut sim, A, QA, send(1, &a, 0, 3));
    post(&mut sim, A, QA, write(2, &a, 0, 3000, b.addr, b.rkey()));
    post(&mut sim, A, QA, read(3, &a, 0, 3000, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    assert!(sim.trace.len() >= 9);
    assert_eq!(sim.nodes[A].rx_parse_drops + sim.nodes[B].rx_parse_drops, 0);
}

#[test]
fn f2_corrupt_payload_dropped_then_retransmitted() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    a.write(0, &pattern(100, 1));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && std::mem::take(&mut once)).then_some(Fault::Corrupt));
    post(&mut sim, A, QA, write(1, &a, 0, 100, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    // The frame parses (the ICRC check is deferred to the QP, as on the lcore); the QP drops it.
    assert_eq!(sim.nodes[B].rx_parse_drops, 0);
    assert_eq!(stats(&sim, B, QB).icrc_errors, 1);
    let t: Vec<_> = sim.trace.iter().filter(|p| p.from == A).map(|p| p.time.0).collect();
    assert_eq!(t[1] - t[0], 4096 << 14);
    assert_eq!(b.read(0, 100), pattern(100, 1));
}

// ICRC and placement (docs/reliability.md): which packets are checked before they act and
// which while their payload is placed.

/// A WRITE FIRST/ONLY carries an untrusted RETH: a corrupted address must never be written,
/// even when it still points inside the MR (the check comes before placement).
#[test]
fn f2_corrupt_reth_address_never_written() {
    for (len, offset_in_reth) in [(100u32, 7usize), (3000, 7), (100, 6)] {
        let mut sim = pair();
        let a = reg(&sim, A, 8192, ALL);
        let b = reg(&sim, B, 8192, ALL);
        a.write(0, &pattern(len as usize, 2));
        b.write(0, &vec![0xEE; 8192]);
        // A first message, so that the connection is established and the responder idle.
        post(&mut sim, A, QA, write(1, &a, 0, 0, b.addr, b.rkey()));
        drive(&mut sim);
        let mut once = true;
        // RETH follows the 12-byte BTH; its VA is 8 bytes big-endian: flipping bit 4 of the
        // last (or second to last) byte moves it by 0x10 (0x1000) inside the 8 KiB MR.
        sim.add_filter(move |p| (p.from == A && p.opcode.info().is_some_and(|i| i.pos.is_start()) && std::mem::take(&mut once)).then_some(Fault::CorruptAt(12 + offset_in_reth)));
        post(&mut sim, A, QA, write(2, &a, 0, len, b.addr + 1024, b.rkey()));
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
        assert_eq!(stats(&sim, B, QB).icrc_errors, 1);
        let mut want = vec![0xEE; 8192];
        want[1024..1024 + len as usize].copy_from_slice(&pattern(len as usize, 2));
        assert!(b.read(0, 8192) == want, "len {len}: bytes outside the WRITE's range changed");
    }
}

/// A WRITE MIDDLE/LAST continuing a validated message is checked while it is placed (one
/// pass): a corrupted one is dropped without advancing the responder (no ACK, no PSN step),
/// the next packet is out of sequence, the sequence NAK brings the retransmission, and the
/// final bytes are right.
#[test]
fn f2_corrupt_write_middle_and_last_checked_while_placed() {
    for victim in [Opcode::RC_RDMA_WRITE_MIDDLE, Opcode::RC_RDMA_WRITE_LAST] {
        let mut sim = pair();
        let a = reg(&sim, A, 8192, ALL);
        let b = reg(&sim, B, 8192, ALL);
        a.write(0, &pattern(3000, 3));
        let mut once = true;
        sim.add_filter(move |p| (p.from == A && p.opcode == victim && std::mem::take(&mut once)).then_some(Fault::Corrupt));
        post(&mut sim, A, QA, write(1, &a, 0, 3000, b.addr, b.rkey()));
        post(&mut sim, A, QA, write(2, &a, 0, 10, b.addr + 4096, b.rkey()));
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
        let s = stats(&sim, B, QB);
        assert_eq!(s.icrc_errors, 1, "{victim:?}");
        assert_eq!(s.resp_bytes_written, 3000 + 10, "{victim:?}: the dropped packet is not counted as written");
        assert_eq!(b.read(0, 3000), pattern(3000, 3));
        assert_eq!(b.read(4096, 10), pattern(10, 3));
        assert!(stats(&sim, A, QA).retries >= 1);
    }
}

/// READ response MIDDLE is checked while placed into the READ's local buffer; FIRST/LAST
/// (AETH) before. Either way a corrupted response is re-requested and the data is right.
#[test]
fn f2_corrupt_read_responses_are_dropped_and_re_requested() {
    for victim in [Opcode::RC_RDMA_READ_RESPONSE_FIRST, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, Opcode::RC_RDMA_READ_RESPONSE_LAST] {
        let mut sim = pair();
        let a = reg(&sim, A, 8192, ALL);
        let b = reg(&sim, B, 8192, ALL);
        b.write(0, &pattern(3000, 4));
        let mut once = true;
        sim.add_filter(move |p| (p.from == B && p.opcode == victim && std::mem::take(&mut once)).then_some(Fault::Corrupt));
        post(&mut sim, A, QA, read(1, &a, 0, 3000, b.addr, b.rkey()));
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success], "{victim:?}");
        assert_eq!(stats(&sim, A, QA).icrc_errors, 1, "{victim:?}");
        assert_eq!(a.read(0, 3000), pattern(3000, 4));
    }
}

/// SEND MIDDLE is checked before it is placed (bytes past the end of a message in the
/// receive buffer must stay untouched); recovery as for any drop.
#[test]
fn f2_corrupt_send_middle_checked_first() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    a.write(0, &pattern(3000, 5));
    post_recv(&mut sim, B, QB, recv(7, &b, 0, 8192));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.opcode == Opcode::RC_SEND_MIDDLE && std::mem::take(&mut once)).then_some(Fault::Corrupt));
    post(&mut sim, A, QA, send(1, &a, 0, 3000));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let r = recv_cqes(&mut sim, B, QB);
    assert_eq!((statuses(&r), r[0].byte_len), (vec![WcStatus::Success], 3000));
    assert_eq!(stats(&sim, B, QB).icrc_errors, 1);
    assert_eq!(b.read(0, 3000), pattern(3000, 5));
}

#[test]
fn f3_ack_request_placement() {
    let mut sim = pair();
    let a = reg(&sim, A, 200 * 1024, ALL);
    let b = reg(&sim, B, 200 * 1024, ALL);
    post(&mut sim, A, QA, write(1, &a, 0, 200 * 1024, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let req: Vec<_> = sim.trace.iter().filter(|p| p.from == A).collect();
    assert_eq!(req.len(), 200);
    let marked: Vec<usize> = req.iter().enumerate().filter(|(_, p)| p.ack_req).map(|(i, _)| i).collect();
    assert_eq!(marked, vec![63, 127, 191, 199]);
    let acks = sim.trace.iter().filter(|p| p.from == B && p.opcode == Opcode::RC_ACKNOWLEDGE).count();
    assert!(acks <= marked.len());
}

#[test]
fn f4_segmentation_of_mtu_times_two_plus_one() {
    let mut sim = pair();
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    post(&mut sim, A, QA, write(1, &a, 0, 2049, b.addr, b.rkey()));
    drive(&mut sim);
    let req: Vec<_> = sim.trace.iter().filter(|p| p.from == A).map(|p| (p.opcode, p.payload_len)).collect();
    assert_eq!(req, vec![(Opcode::RC_RDMA_WRITE_FIRST, 1024), (Opcode::RC_RDMA_WRITE_MIDDLE, 1024), (Opcode::RC_RDMA_WRITE_LAST, 1)]);
    assert!(Opcode::RC_RDMA_WRITE_FIRST.info().unwrap().ext.contains(pmrxe_wire::ExtSet::RETH));
    assert!(!Opcode::RC_RDMA_WRITE_LAST.info().unwrap().ext.contains(pmrxe_wire::ExtSet::RETH));
}

#[test]
fn f5_psn_wrap_with_retry() {
    let p = PairParams { sq_psn: 0xFF_FFFE, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    a.write(0, &pattern(4096, 3));
    let mut once = true;
    sim.add_filter(move |p| (p.from == A && p.psn == 0 && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 4096, b.addr, b.rkey()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    let first: Vec<u32> = sim.trace.iter().filter(|p| p.from == A).take(4).map(|p| p.psn).collect();
    assert_eq!(first, vec![0xFF_FFFE, 0xFF_FFFF, 0, 1]);
    assert_eq!(b.read(0, 4096), pattern(4096, 3));
}

#[test]
fn f6_responder_length_checks() {
    for bad_middle in [true, false] {
        let mut sim = pair();
        let b = reg(&sim, B, 8192, ALL);
        let mut h = TransportHeaders::new(bth(Opcode::RC_RDMA_WRITE_FIRST, 100));
        h.reth = Some(RethRepr { va: b.addr, rkey: b.rkey(), len: 3000 });
        h.bth.ack_req = false;
        assert!(raw_to_b(&mut sim, h, &[0u8; 1024]).is_empty());
        let (op, len) = if bad_middle { (Opcode::RC_RDMA_WRITE_MIDDLE, 100) } else { (Opcode::RC_RDMA_WRITE_LAST, 0) };
        let out = raw_to_b(&mut sim, TransportHeaders::new(bth(op, 101)), &vec![0u8; len]);
        assert_eq!(out[0].aeth.unwrap().syndrome, Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(out[0].bth.psn, Psn::new(101));
    }
    let _ = MsgPos::Only;
}

#[test]
fn f7_unknown_opcode_and_short_packets_are_dropped() {
    let mut sim = pair();
    // Short frame / unknown opcode never reach the QP: parse_frame refuses them.
    assert!(pmrxe_wire::parse_frame(&[0u8; 20]).is_err());
    let mut h = TransportHeaders::new(bth(Opcode::RC_SEND_ONLY, 100));
    h.bth.opcode = Opcode(0xFF);
    let out = raw_to_b(&mut sim, h, &[]);
    assert!(out.is_empty());
    assert_eq!(stats(&sim, B, QB).dropped, 1);
    assert_eq!(st(&sim, B, QB), QpState::Rts);
}

#[test]
fn f8_udp_source_port_constant_per_qp() {
    let mut sim = pair();
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    for i in 0..5 {
        post(&mut sim, A, QA, write(i, &a, 0, 3000, b.addr, b.rkey()));
    }
    drive(&mut sim);
    let ports: std::collections::BTreeSet<u16> = sim.trace.iter().filter(|p| p.from == A).map(|p| p.udp_sport).collect();
    assert_eq!(ports.len(), 1);
    assert!(*ports.iter().next().unwrap() >= 0xC000);
    let _ = CqSide::Send;
}

/// Issue 13 item 6: a type-2 MW bound on QP A1 and invalidated with LOCAL_INV is FREE and may
/// be bound again, with a new key, from another QP A2 of the same PD; B reaches it through the
/// QP connected to A2 only. Both binds name the MW as verbs does (`ibv_mw.rkey`, which stays
/// the allocation key).
#[test]
fn mw2_invalidated_can_be_rebound_from_another_qp() {
    let mut sim = pair();
    let (qa2, qb2) = (QA + 1, QB + 1);
    sim.connect(A, qa2, B, qb2, &PairParams::default());
    let (x, k) = fmr_valid(&mut sim, 1, 0, LW | RW | RR | Access::MW_BIND);
    let iova = x.iova(&sim, A);
    let mw = sim.nodes[A].mem.table().alloc_mw(PD, MwType::Type2).unwrap();
    let (k1, k2) = (mw.inc(), mw.inc().inc());
    let bind = |id, mw, new_key| SendWqe::new(id, SendOp::BindMw { mw, new_key, mr: k, addr: iova, len: 4096, access: RW | RR }).flags(sig());
    post(&mut sim, A, QA, bind(1, mw, k1));
    post(&mut sim, A, QA, local_inv(2, k1));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
    assert_eq!(mr_state(&sim, A, k1), MrState::Free);
    post(&mut sim, A, qa2, bind(3, mw, k2));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, qa2)), vec![WcStatus::Success]);
    assert_eq!(st(&sim, A, qa2), QpState::Rts);
    let b = reg(&sim, B, 4096, ALL);
    b.write(0, &pattern(64, 3));
    post(&mut sim, B, qb2, write(4, &b, 0, 64, iova + 8, k2.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, qb2)), vec![WcStatus::Success]);
    assert_eq!(x.read(8, 64), pattern(64, 3));
    // The first QP no longer owns the window.
    post(&mut sim, B, QB, write(5, &b, 0, 8, iova, k2.0));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, B, QB)), vec![WcStatus::RemAccessErr]);
}
