//! The ABI structs the shim hands to applications have exactly the sizes and offsets measured
//! against the real rdma-core 44 `verbs.h` (reference/probe-data/sizes.txt). bindgen's own
//! layout asserts check the generated code against clang; this pins the numbers a C program
//! compiled elsewhere relies on.
use pmrxe_verbs::sys::*;
use std::mem::{align_of, offset_of, size_of};

#[test]
fn sizes_match_probe_data() {
    let cases: &[(&str, usize, usize)] = &[
        ("ibv_device", size_of::<ibv_device>(), 664),
        ("ibv_context", size_of::<ibv_context>(), 328),
        ("verbs_context", size_of::<verbs_context>(), 648),
        ("ibv_pd", size_of::<ibv_pd>(), 16),
        ("ibv_mr", size_of::<ibv_mr>(), 48),
        ("ibv_cq", size_of::<ibv_cq>(), 128),
        ("ibv_cq_ex", size_of::<ibv_cq_ex>(), 288),
        ("ibv_qp", size_of::<ibv_qp>(), 160),
        ("ibv_qp_ex", size_of::<ibv_qp_ex>(), 352),
        ("ibv_srq", size_of::<ibv_srq>(), 128),
        ("ibv_ah", size_of::<ibv_ah>(), 24),
        ("ibv_comp_channel", size_of::<ibv_comp_channel>(), 16),
        ("ibv_wc", size_of::<ibv_wc>(), 48),
        ("ibv_send_wr", size_of::<ibv_send_wr>(), 128),
        ("ibv_recv_wr", size_of::<ibv_recv_wr>(), 32),
        ("ibv_sge", size_of::<ibv_sge>(), 16),
        ("ibv_port_attr", size_of::<ibv_port_attr>(), 52),
        ("ibv_device_attr", size_of::<ibv_device_attr>(), 232),
        ("ibv_device_attr_ex", size_of::<ibv_device_attr_ex>(), 400),
        ("ibv_qp_attr", size_of::<ibv_qp_attr>(), 144),
        ("ibv_qp_init_attr", size_of::<ibv_qp_init_attr>(), 64),
        ("ibv_qp_init_attr_ex", size_of::<ibv_qp_init_attr_ex>(), 136),
        ("ibv_gid", size_of::<ibv_gid>(), 16),
        ("ibv_gid_entry", size_of::<ibv_gid_entry>(), 32),
    ];
    let bad: Vec<_> = cases.iter().filter(|(_, got, want)| got != want).collect();
    assert!(bad.is_empty(), "size mismatches (name, ours, verbs.h): {bad:?}");
    assert_eq!(align_of::<ibv_port_attr>(), 4);
    assert_eq!(align_of::<verbs_context>(), 8);
}

#[test]
fn offsets_match_probe_data() {
    assert_eq!(offset_of!(ibv_device, name), 24);
    assert_eq!(offset_of!(ibv_device, dev_name), 88);
    assert_eq!(offset_of!(ibv_device, dev_path), 152);
    assert_eq!(offset_of!(ibv_device, ibdev_path), 408);
    let ops = offset_of!(ibv_context, ops);
    assert_eq!(ops, 8);
    assert_eq!(ops + offset_of!(ibv_context_ops, poll_cq), 96);
    assert_eq!(ops + offset_of!(ibv_context_ops, req_notify_cq), 104);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_srq_recv), 168);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_send), 208);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_recv), 216);
    assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
    assert_eq!(offset_of!(ibv_context, mutex), 280);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(offset_of!(verbs_context, query_port), 0);
    assert_eq!(offset_of!(verbs_context, priv_), 208);
    assert_eq!(offset_of!(verbs_context, query_device_ex), 216);
    assert_eq!(offset_of!(verbs_context, create_qp_ex), 264);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(offset_of!(ibv_qp_ex, wr_rdma_write), 224);
    assert_eq!(offset_of!(ibv_qp_ex, wr_start), 320);
    assert_eq!(offset_of!(ibv_send_wr, wr), 40);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
}

/// The C-struct-first rule: a handle pointer and its C pointer are the same address.
#[test]
fn verbs_context_slot_rule_holds_for_every_op_we_fill() {
    // verbs_get_ctx_op(ctx, op) needs sz >= sizeof(verbs_context) - offsetof(op); we set
    // sz = sizeof, which covers query_port at offset 0.
    assert!(size_of::<verbs_context>() >= size_of::<verbs_context>() - offset_of!(verbs_context, query_port));
}
