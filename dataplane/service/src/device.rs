//! Devices as verbs programs see them: pmrxe0..N, one port each, RoCEv2 GIDs, honest limits.
use std::net::IpAddr;

use pmrxe_abi::ctrl::{DeviceAttr, DeviceInfo, GidEntry, PortAttr};
use pmrxe_config::{Config, PortConfig};
use pmrxe_runtime::neigh::ip_to_gid;

/// `enum ibv_gid_type` value for RoCE v2.
pub const GID_TYPE_ROCE_V2: u32 = 2;
/// Vendor id: no IEEE OUI is registered for pmrxe, so report 0xFFFFFF as the software
/// providers do (rxe); 0 reads as "no device" to some tools (the rdma-core suite asserts a
/// non-zero vendor, perftest treats 0 as an unknown device). Part id: one no tool special-cases.
pub const VENDOR_ID: u32 = 0x00ff_ffff;
/// See [`VENDOR_ID`].
pub const VENDOR_PART_ID: u32 = 0x5058;

/// The engine's hard limits the device may advertise.
pub const ENGINE_MAX_SGE: u32 = pmrxe_transport::MAX_SGE as u32;
/// Inline bytes per WQE.
pub const ENGINE_MAX_INLINE: u32 = pmrxe_transport::MAX_INLINE as u32;

/// A port's congestion control for its QPs: off unless `ecn`; then the notification point
/// (CNPs) and the DCQCN reaction point with the `[ports.congestion]` parameters.
pub fn congestion(ecn: bool, c: &pmrxe_config::CongestionConfig) -> pmrxe_transport::CcConfig {
    if !ecn {
        return pmrxe_transport::CcConfig::default();
    }
    let us = |v: u32| u64::from(v) * 1_000;
    let mbps = |v: u64| v.saturating_mul(1_000_000);
    pmrxe_transport::CcConfig {
        np: Some(pmrxe_transport::NpParams { cnp_interval_ns: us(c.cnp_interval_us), cnp_dscp: c.cnp_dscp }),
        rp: Some(pmrxe_transport::DcqcnParams {
            line_rate_bps: mbps(c.line_rate_mbps),
            min_rate_bps: mbps(c.min_rate_mbps),
            g: c.alpha_g,
            alpha_timer_ns: us(c.alpha_timer_us),
            initial_alpha: c.initial_alpha,
            rate_increase_timer_ns: us(c.rate_increase_timer_us),
            byte_counter: c.byte_counter,
            fast_recovery_steps: c.fast_recovery_steps,
            ai_rate_bps: mbps(c.ai_rate_mbps),
            hai_rate_bps: mbps(c.hai_rate_mbps),
            rate_reduce_period_ns: us(c.rate_reduce_period_us),
        }),
    }
}

/// The GID table of a port: [0] link-local from the MAC, [1] IPv4-mapped (if configured; rxe
/// and `ibv_rc_pingpong -g 1` put it there), then the IPv6 address. All RoCE v2.
pub fn gids(p: &PortConfig, mac: [u8; 6]) -> Vec<[u8; 16]> {
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[8] = mac[0] ^ 2;
    ll[9] = mac[1];
    ll[10] = mac[2];
    ll[11] = 0xff;
    ll[12] = 0xfe;
    ll[13] = mac[3];
    ll[14] = mac[4];
    ll[15] = mac[5];
    let mut v = vec![ll];
    if let Some(v4) = &p.ipv4 {
        v.push(ip_to_gid(IpAddr::V4(v4.addr)));
    }
    if let Some(v6) = &p.ipv6 {
        v.push(ip_to_gid(IpAddr::V6(v6.addr)));
    }
    v
}

/// `enum ibv_mtu` for the largest RoCE path MTU that fits an Ethernet MTU (IP+UDP+BTH+RETH+ICRC
/// overhead of at most 80 bytes).
pub fn ibv_mtu(eth_mtu: u16) -> u32 {
    let room = u32::from(eth_mtu).saturating_sub(80);
    match room {
        r if r >= 4096 => 5,
        r if r >= 2048 => 4,
        r if r >= 1024 => 3,
        r if r >= 512 => 2,
        _ => 1,
    }
}

/// Build the device description of port `index`.
pub fn device_info(cfg: &Config, index: usize, mac: [u8; 6]) -> DeviceInfo {
    let p = &cfg.ports[index];
    let l = &cfg.limits;
    let guid = u64::from_be_bytes([mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
    let gids = gids(p, mac);
    let mtu = ibv_mtu(p.mtu);
    DeviceInfo {
        index: index as u32,
        name: p.name.clone(),
        guid,
        mac,
        attr: DeviceAttr {
            fw_ver: format!("pmrxe {}", env!("CARGO_PKG_VERSION")),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: l.max_mr_size,
            page_size_cap: 0xffff_f000,
            vendor_id: p.vendor_id.unwrap_or(VENDOR_ID),
            vendor_part_id: p.vendor_part_id.unwrap_or(VENDOR_PART_ID),
            hw_ver: 0,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr.min(pmrxe_transport::attr::MAX_QP_WR),
            // CURR_QP_STATE_MOD | PORT_ACTIVE_EVENT | SYS_IMAGE_GUID | RC_RNR_NAK_GEN |
            // MEM_WINDOW | MEM_MGT_EXTENSIONS | MEM_WINDOW_TYPE_2B (IBV_DEVICE_* bits)
            device_cap_flags: (1 << 7) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 17) | (1 << 21) | (1 << 24),
            max_sge: l.max_sge.min(ENGINE_MAX_SGE),
            max_sge_rd: l.max_sge.min(ENGINE_MAX_SGE),
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_pd: l.max_pd,
            max_qp_rd_atom: l.max_rd_atomic,
            max_qp_init_rd_atom: l.max_rd_atomic,
            max_res_rd_atom: l.max_rd_atomic.saturating_mul(l.max_qp),
            atomic_cap: 1, // IBV_ATOMIC_HCA: atomic with respect to other pmrxe operations
            max_mw: l.max_mw,
            max_ah: l.max_ah,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_sge.min(ENGINE_MAX_SGE),
            max_pkeys: 1,
            max_fast_reg_page_list_len: l.max_fast_reg_pages,
            max_inline_data: l.max_inline.min(ENGINE_MAX_INLINE),
        },
        port: PortAttr {
            state: 4, // ACTIVE
            max_mtu: mtu,
            active_mtu: mtu,
            gid_tbl_len: gids.len() as u32,
            port_cap_flags: 1 << 16 | 1 << 26, // CM_SUP | IP_BASED_GIDS
            max_msg_sz: l.max_msg_size,
            pkey_tbl_len: 1,
            active_width: 2,  // 4x
            active_speed: 32, // EDR-ish label; software speed is what the benchmarks say
            phys_state: 5,    // LINKUP
            link_layer: 2,    // Ethernet
        },
        gids: gids.iter().enumerate().map(|(i, g)| GidEntry { index: i as u32, gid: *g, gid_type: GID_TYPE_ROCE_V2 }).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_devices_have_roce_v2_ipv4_mapped_gid_at_index_1() {
        let cfg = Config::parse_unvalidated(pmrxe_config::DEFAULT_LOOPBACK).unwrap();
        let d = device_info(&cfg, 0, [2, 0, 0xc6, 0x12, 0, 1]);
        assert_eq!(d.name, "pmrxe0");
        assert_eq!(d.gids[1].gid[10..], [0xff, 0xff, 198, 18, 0, 1]);
        assert_eq!(d.port.link_layer, 2);
        assert_eq!(d.port.active_mtu, 5, "9000-byte Ethernet → 4096-byte RoCE MTU");
        assert_eq!(ibv_mtu(1500), 3, "1500-byte Ethernet → 1024-byte RoCE MTU");
        assert!(d.attr.max_sge <= ENGINE_MAX_SGE);
    }
}

#[cfg(test)]
mod congestion_test {
    /// The config defaults map to the transport's (paper / ConnectX) defaults exactly.
    #[test]
    fn defaults_match_the_transport() {
        let cc = super::congestion(true, &pmrxe_config::CongestionConfig::default());
        assert_eq!(cc.np, Some(pmrxe_transport::NpParams::default()));
        assert_eq!(cc.rp, Some(pmrxe_transport::DcqcnParams::default()));
        assert_eq!(super::congestion(false, &pmrxe_config::CongestionConfig::default()), pmrxe_transport::CcConfig::default());
    }
}
