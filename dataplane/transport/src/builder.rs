//! The packet builder: BTH defaults and the one function that writes a transport packet
//! (headers + payload + pad) into a frame buffer while folding its ICRC. The requester
//! (requests, retransmissions) and the responder (ACK/NAK, READ responses, atomic ACKs) both
//! emit through it; neither writes headers itself.

use pmrxe_mem::MemError;
use pmrxe_wire::{BthRepr, Psn, Qpn, TransportHeaders};

use crate::memops::MemOps;

/// Default P_Key.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// What the payload of a packet comes from.
pub(crate) enum Payload<'a> {
    None,
    /// Gather from SGEs at a message offset.
    Gather { sges: &'a [pmrxe_mem::Sge], offset: u64, len: usize },
    /// Inline bytes.
    Bytes(&'a [u8]),
    /// Read through the window a READ request was validated with (READ responses): va, len.
    Remote { tr: &'a pmrxe_mem::Translation, va: u64, len: usize },
}

/// Write `hdr` + payload + pad into `buf`; returns the length and, for a long payload, the tail
/// CRC (the ICRC's CRC of these bytes, BTH byte 4 masked, folded while the payload is copied:
/// `pmrxe_wire::finish_frame_with_tail_crc` joins it to the IP/UDP prefix), or the gather
/// error. A short packet's CRC is left to the frame (see `Transmit::tail_crc`).
pub(crate) fn build<M: MemOps + ?Sized>(
    mem: &M,
    pd: u32,
    qpn: u32,
    mut hdr: TransportHeaders,
    payload: Payload<'_>,
    buf: &mut [u8],
) -> Result<Option<(usize, Option<u32>)>, MemError> {
    let plen = match &payload {
        Payload::None => 0,
        Payload::Gather { len, .. } => *len,
        Payload::Bytes(b) => b.len(),
        Payload::Remote { len, .. } => *len,
    };
    let pad = (4 - (plen & 3)) & 3;
    hdr.bth.pad = pad as u8;
    let Ok(hlen) = hdr.emit(buf) else { return Ok(None) };
    let total = hlen + plen + pad;
    if buf.len() < total {
        return Ok(None);
    }
    if plen <= SMALL_PAYLOAD {
        // Short: copy; the frame is hashed whole later, in one CRC update (a header update, a
        // payload update and a pad update cost more than the bytes they hash).
        match payload {
            Payload::None => {}
            Payload::Gather { sges, offset, len } => mem.gather(pd, qpn, sges, offset, &mut buf[hlen..hlen + len])?,
            Payload::Bytes(b) => pmrxe_crc::copy_short(&mut buf[hlen..hlen + b.len()], b),
            Payload::Remote { tr, va, len } => mem.read_carried(tr, va, &mut buf[hlen..hlen + len])?,
        }
        zero_pad(&mut buf[hlen + plen..total]);
        return Ok(Some((total, None)));
    }
    // Long: the payload is hashed from zero while it is gathered, the headers after it (by
    // then their stores have settled; hashed first, the CRC's loads waited on them), and the
    // two CRCs are joined by combination (x^(8·len) for this length: one or two multiplies).
    let body = match payload {
        Payload::None => 0,
        Payload::Gather { sges, offset, len } => mem.gather_crc(pd, qpn, sges, offset, &mut buf[hlen..hlen + len], 0)?,
        Payload::Bytes(b) => pmrxe_crc::copy_and_crc(0, &mut buf[hlen..hlen + b.len()], b),
        Payload::Remote { tr, va, len } => mem.read_carried_crc(tr, va, &mut buf[hlen..hlen + len], 0)?,
    };
    let body = if pad > 0 {
        zero_pad(&mut buf[hlen + plen..total]);
        pmrxe_crc::crc_update(body, &buf[hlen + plen..total])
    } else {
        body
    };
    let head = pmrxe_wire::icrc::transport_crc(&buf[..hlen]);
    Ok(Some((total, Some(pmrxe_crc::crc32_combine(head, body, (total - hlen) as u64)))))
}

/// Zero the 0..=3 pad bytes, unrolled (a `fill` of so few bytes was a memset call per packet).
#[inline]
fn zero_pad(pad: &mut [u8]) {
    for i in 0..3 {
        if let Some(b) = pad.get_mut(i) {
            *b = 0;
        }
    }
}

/// Payloads up to this length are copied first and hashed with their headers in one update;
/// longer ones are hashed while copied (one pass per byte).
const SMALL_PAYLOAD: usize = 128;

/// A BTH with our defaults.
pub(crate) fn bth(opcode: pmrxe_wire::Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        migreq: true,
        pad: 0,
        tver: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(dest_qp),
        ack_req: false,
        psn,
    }
}
