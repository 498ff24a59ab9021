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

/// librdmacm's structs (`rdma/rdma_cma.h`, rdma-core 44), numbers measured with gcc on the
/// target (sizeof/offsetof of the installed header): programs read `rdma_cm_id` fields
/// (`verbs`, `qp`, `route.addr`, `pd`, ...) and event params directly.
#[test]
fn librdmacm_layouts_match_rdma_cma_h() {
    let sizes: &[(&str, usize, usize)] = &[
        ("rdma_cm_id", size_of::<rdma_cm_id>(), 416),
        ("rdma_event_channel", size_of::<rdma_event_channel>(), 4),
        ("rdma_cm_event", size_of::<rdma_cm_event>(), 80),
        ("rdma_conn_param", size_of::<rdma_conn_param>(), 24),
        ("rdma_ud_param", size_of::<rdma_ud_param>(), 56),
        ("rdma_addrinfo", size_of::<rdma_addrinfo>(), 96),
        ("rdma_route", size_of::<rdma_route>(), 312),
        ("rdma_addr", size_of::<rdma_addr>(), 296),
        ("ibv_sa_path_rec", size_of::<ibv_sa_path_rec>(), 64),
        ("rdma_ib_addr", size_of::<rdma_ib_addr>(), 40),
    ];
    let bad: Vec<_> = sizes.iter().filter(|(_, got, want)| got != want).collect();
    assert!(bad.is_empty(), "size mismatches (name, ours, rdma_cma.h): {bad:?}");
    let offsets: &[(&str, usize, usize)] = &[
        ("rdma_cm_id.verbs", offset_of!(rdma_cm_id, verbs), 0),
        ("rdma_cm_id.channel", offset_of!(rdma_cm_id, channel), 8),
        ("rdma_cm_id.context", offset_of!(rdma_cm_id, context), 16),
        ("rdma_cm_id.qp", offset_of!(rdma_cm_id, qp), 24),
        ("rdma_cm_id.route", offset_of!(rdma_cm_id, route), 32),
        ("rdma_cm_id.ps", offset_of!(rdma_cm_id, ps), 344),
        ("rdma_cm_id.port_num", offset_of!(rdma_cm_id, port_num), 348),
        ("rdma_cm_id.event", offset_of!(rdma_cm_id, event), 352),
        ("rdma_cm_id.send_cq_channel", offset_of!(rdma_cm_id, send_cq_channel), 360),
        ("rdma_cm_id.send_cq", offset_of!(rdma_cm_id, send_cq), 368),
        ("rdma_cm_id.recv_cq_channel", offset_of!(rdma_cm_id, recv_cq_channel), 376),
        ("rdma_cm_id.recv_cq", offset_of!(rdma_cm_id, recv_cq), 384),
        ("rdma_cm_id.srq", offset_of!(rdma_cm_id, srq), 392),
        ("rdma_cm_id.pd", offset_of!(rdma_cm_id, pd), 400),
        ("rdma_cm_id.qp_type", offset_of!(rdma_cm_id, qp_type), 408),
        ("rdma_route.path_rec", offset_of!(rdma_route, path_rec), 296),
        ("rdma_route.num_paths", offset_of!(rdma_route, num_paths), 304),
        ("rdma_addr.addr", offset_of!(rdma_addr, addr), 256),
        ("rdma_cm_event.listen_id", offset_of!(rdma_cm_event, listen_id), 8),
        ("rdma_cm_event.event", offset_of!(rdma_cm_event, event), 16),
        ("rdma_cm_event.status", offset_of!(rdma_cm_event, status), 20),
        ("rdma_cm_event.param", offset_of!(rdma_cm_event, param), 24),
        ("rdma_conn_param.private_data_len", offset_of!(rdma_conn_param, private_data_len), 8),
        ("rdma_conn_param.responder_resources", offset_of!(rdma_conn_param, responder_resources), 9),
        ("rdma_conn_param.initiator_depth", offset_of!(rdma_conn_param, initiator_depth), 10),
        ("rdma_conn_param.rnr_retry_count", offset_of!(rdma_conn_param, rnr_retry_count), 13),
        ("rdma_conn_param.srq", offset_of!(rdma_conn_param, srq), 14),
        ("rdma_conn_param.qp_num", offset_of!(rdma_conn_param, qp_num), 16),
        ("rdma_ud_param.private_data_len", offset_of!(rdma_ud_param, private_data_len), 8),
        ("rdma_ud_param.ah_attr", offset_of!(rdma_ud_param, ah_attr), 16),
        ("rdma_ud_param.qp_num", offset_of!(rdma_ud_param, qp_num), 48),
        ("rdma_ud_param.qkey", offset_of!(rdma_ud_param, qkey), 52),
        ("rdma_addrinfo.ai_src_len", offset_of!(rdma_addrinfo, ai_src_len), 16),
        ("rdma_addrinfo.ai_src_addr", offset_of!(rdma_addrinfo, ai_src_addr), 24),
        ("rdma_addrinfo.ai_dst_addr", offset_of!(rdma_addrinfo, ai_dst_addr), 32),
        ("rdma_addrinfo.ai_route_len", offset_of!(rdma_addrinfo, ai_route_len), 56),
        ("rdma_addrinfo.ai_connect", offset_of!(rdma_addrinfo, ai_connect), 80),
        ("rdma_addrinfo.ai_next", offset_of!(rdma_addrinfo, ai_next), 88),
        ("ibv_sa_path_rec.dlid", offset_of!(ibv_sa_path_rec, dlid), 32),
        ("ibv_sa_path_rec.raw_traffic", offset_of!(ibv_sa_path_rec, raw_traffic), 36),
        ("ibv_sa_path_rec.flow_label", offset_of!(ibv_sa_path_rec, flow_label), 40),
        ("ibv_sa_path_rec.reversible", offset_of!(ibv_sa_path_rec, reversible), 48),
        ("ibv_sa_path_rec.numb_path", offset_of!(ibv_sa_path_rec, numb_path), 52),
        ("ibv_sa_path_rec.pkey", offset_of!(ibv_sa_path_rec, pkey), 54),
        ("ibv_sa_path_rec.mtu", offset_of!(ibv_sa_path_rec, mtu), 58),
        ("ibv_sa_path_rec.packet_life_time", offset_of!(ibv_sa_path_rec, packet_life_time), 62),
        ("ibv_sa_path_rec.preference", offset_of!(ibv_sa_path_rec, preference), 63),
    ];
    let bad: Vec<_> = offsets.iter().filter(|(_, got, want)| got != want).collect();
    assert!(bad.is_empty(), "offset mismatches (field, ours, rdma_cma.h): {bad:?}");
    assert_eq!(align_of::<rdma_cm_id>(), 8);
}
