//! pmrxe-wire: RoCEv2 wire formats.
//!
//! # Contract (smoltcp style)
//!
//! This crate is pure packet representation: no state, no I/O, no allocation in any
//! parse or emit path, and no `unsafe` (the CRC kernels live in `pmrxe-crc`). Each header has two levels:
//!
//! * `Packet<T: AsRef<[u8]>>` (exported as e.g. [`BthPacket`]) is a zero-copy view over any
//!   buffer (a slice, a `Vec`, an mbuf data area). Getters need `AsRef<[u8]>`, setters
//!   additionally `AsMut<[u8]>`. `new_unchecked` wraps without checking; `new_checked`
//!   calls `check_len`. **After `check_len()` returns `Ok`, no accessor panics.**
//!   On the emit path use `new_unchecked` on a buffer of exactly `Repr::buffer_len()` bytes:
//!   a reused buffer holds stale length fields, so `new_checked` would judge garbage.
//! * `Repr` is the small validated form: `Repr::parse(&Packet) -> Result<Repr>` never
//!   panics after `new_checked`; `Repr::emit(&self, &mut Packet)` never panics if the buffer is
//!   at least `buffer_len()` bytes long.
//!
//! The whole-packet API used by the transport and the runtime is in [`frame`]
//! ([`parse_frame`], [`emit_frame_headers`], [`finish_frame`]) and [`headers`]
//! ([`TransportHeaders`]). The opcode table ([`opcode`]) drives which extension headers a
//! packet carries; offsets and lengths are computed from it, never typed by hand.
//!
//! Non-RoCE frames are reported as such by [`parse_frame`] ([`Error::Arp`],
//! [`Error::Icmpv6`]) so the runtime can hand them to its neighbour code ([`arp`],
//! [`icmpv6`]).
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod error;
pub mod psn;
pub mod qpn;
pub mod opcode;

pub mod eth;
pub mod arp;
pub mod ipv4;
pub mod ipv6;
pub mod icmpv6;
pub mod mcast;
pub mod udp;
pub mod bth;
pub mod reth;
pub mod aeth;
pub mod atomic_eth;
pub mod atomic_ack_eth;
pub mod immdt;
pub mod ieth;
pub mod deth;
pub mod icrc;
pub mod cnp;
pub mod ecn;

pub mod headers;
pub mod frame;
pub mod predict;
pub mod pcap;
pub mod sample;

pub mod field;
pub(crate) use field::{rd16, rd32, rd64, wr16, wr32, wr64, Field};

pub use error::{Error, Result};
pub use psn::{Msn, Not24Bits, Psn};
pub use qpn::{PKey, Qpn};
pub use opcode::{next_opcode, ExtSet, MsgPos, OpInfo, OpKind, Opcode, QpType};

pub use eth::{EtherType, MacAddr, Packet as EthPacket, Repr as EthRepr};
pub use arp::{ArpOp, Packet as ArpPacket, Repr as ArpRepr};
pub use ipv4::{Packet as Ipv4Packet, Repr as Ipv4Repr};
pub use ipv6::{Packet as Ipv6Packet, Repr as Ipv6Repr};
pub use icmpv6::{NdRepr, Packet as Icmpv6Packet};
pub use udp::{Packet as UdpPacket, Repr as UdpRepr, ROCE_PORT};
pub use bth::{Packet as BthPacket, Repr as BthRepr};
pub use reth::{Packet as RethPacket, Repr as RethRepr};
pub use aeth::{NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use immdt::Packet as ImmDtPacket;
pub use ieth::Packet as IethPacket;
pub use deth::{Packet as DethPacket, Repr as DethRepr};
pub use icrc::{icrc, IcrcCheck, ICRC_LEN};
pub use cnp::{build_cnp_frame, parse_cnp_frame, CnpFrame, Repr as CnpRepr};

pub use headers::TransportHeaders;
pub use predict::RxPrediction;
pub use frame::{
    build_frame, build_frame_vec, emit_frame_headers, finish_frame, finish_frame_with_tail_crc, seal_frame,
    frame_header_len, frame_len, pad_for, parse_frame, parse_frame_deferred, parse_frame_into, parse_frame_routed, parse_frame_with,
    udp_sport, L3Info, ParseOptions, RoceFrame, RxFrame,
};
pub use pcap::{read_pcap, PcapReader, PcapRecord, PcapWriter};
pub use sample::{sample_frames, sample_specs, write_sample, SampleSpec};
pub use arp::{emit_arp_frame, parse_arp_frame};
pub use icmpv6::{emit_nd_frame, parse_nd_frame, NdFrame};

