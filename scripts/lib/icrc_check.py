#!/usr/bin/env python3
"""icrc_check.py: pmrxe's own RoCEv2 ICRC and header checker for packet captures.

An independent test tool: it shares no code with pmrxe (Python standard library only, the CRC
is zlib's), so a test that builds frames with pmrxe's Rust code and checks them here compares two
implementations of the spec.

Usage:
  icrc_check.py [-v] [--port N] [--strict-pad] [--check-ip-csum] CAPTURE...
  icrc_check.py --selftest

CAPTURE: classic pcap (either byte order, microsecond or nanosecond timestamps) or pcapng.
Link layers: Ethernet (802.1Q/802.1ad tags skipped), Linux cooked (SLL, SLL2), raw IP.

Every UDP datagram to port 4791 (--port) over IPv4 or IPv6 is a RoCEv2 packet, and is checked:

ICRC (IBTA Annex A17, RoCEv2): CRC-32 (reflected polynomial 0xEDB88320, initial and final XOR
0xFFFFFFFF: zlib's) over
  1. 8 bytes of 0xFF (in place of the InfiniBand LRH);
  2. the IP header with its variant fields set to ones: IPv4 type of service (DSCP and ECN),
     time to live, header checksum; IPv6 traffic class, flow label, hop limit;
  3. the UDP header with the checksum set to ones;
  4. the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to ones;
  5. everything after the BTH up to the ICRC (extension headers, payload, pad).
The 4-byte ICRC closing the UDP payload holds that CRC least significant byte first.

Malformed: a frame cut by the capture's snap length, an IPv4 fragment, an IP length the frame
cannot hold, a UDP length other than the IP payload length, a datagram too short for BTH + ICRC,
BTH transport version not 0, an unknown opcode, extension headers longer than the packet, a
transport length (BTH to ICRC) not a multiple of 4, a pad count larger than the payload,
FIRST/MIDDLE packets with pad or no payload, a LAST packet without payload, payload or pad on an
opcode that carries none, an ATOMIC_WRITE whose payload is not 8 bytes. --strict-pad: the pad
bytes must be zero. --check-ip-csum: the IPv4 header checksum must be right (off by default:
captures of checksum-offloading NICs hold wrong ones).

Output: one line per bad packet (with -v, one per good packet too, and a count per opcode), then
"checked N packets, M bad ICRC, K malformed". Exit status 0 only when N > 0 and M = K = 0,
1 otherwise (an unreadable capture counts as malformed), 2 on a usage error. IPv6 packets with
extension headers are not RoCEv2 packets here (RoCEv2 does not use them).
"""
import struct
import sys
import zlib

ROCEV2_PORT = 4791
LRH_STANDIN = b"\xff" * 8

# --------------------------------------------------------------------------------------------
# Opcodes (IBTA vol. 1, table 38 "OpCode field"): the top 3 bits name the transport, the low 5
# the operation. Extension headers per operation, in bytes: RETH 16, AETH 4, ImmDt 4, IETH 4,
# AtomicETH 28, AtomicAckETH 8, DETH 8, XRCETH 4, FETH 4.
# Payload rule: "full" (FIRST/MIDDLE: a whole PMTU, so at least one byte and no pad), "some" (LAST:
# at least one byte), "any" (ONLY: zero or more), "none" (no payload and no pad), "eight"
# (ATOMIC_WRITE: exactly 8 bytes).
OPERATIONS = {
    # low 5 bits: (name, extension bytes, payload rule)
    0x00: ("SEND_FIRST", 0, "full"),
    0x01: ("SEND_MIDDLE", 0, "full"),
    0x02: ("SEND_LAST", 0, "some"),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", 4, "some"),
    0x04: ("SEND_ONLY", 0, "any"),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", 4, "any"),
    0x06: ("RDMA_WRITE_FIRST", 16, "full"),
    0x07: ("RDMA_WRITE_MIDDLE", 0, "full"),
    0x08: ("RDMA_WRITE_LAST", 0, "some"),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", 4, "some"),
    0x0A: ("RDMA_WRITE_ONLY", 16, "any"),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", 20, "any"),
    0x0C: ("RDMA_READ_REQUEST", 16, "none"),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", 4, "full"),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", 0, "full"),
    0x0F: ("RDMA_READ_RESPONSE_LAST", 4, "some"),
    0x10: ("RDMA_READ_RESPONSE_ONLY", 4, "any"),
    0x11: ("ACKNOWLEDGE", 4, "none"),
    0x12: ("ATOMIC_ACKNOWLEDGE", 4 + 8, "none"),
    0x13: ("CMP_SWAP", 28, "none"),
    0x14: ("FETCH_ADD", 28, "none"),
    0x16: ("SEND_LAST_WITH_INVALIDATE", 4, "some"),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", 4, "any"),
    0x1C: ("FLUSH", 4 + 16, "none"),
    0x1D: ("ATOMIC_WRITE", 16, "eight"),
}
# transport prefix: (name, extra leading extension bytes, highest operation it has)
TRANSPORTS = {0x00: ("RC", 0, 0x1D), 0x20: ("UC", 0, 0x0B), 0xA0: ("XRC", 4, 0x17)}


def opcode_info(op):
    """(name, extension header bytes, payload rule), or None for an opcode RoCEv2 lacks."""
    if op == 0x64:
        return ("UD_SEND_ONLY", 8, "any")
    if op == 0x65:
        return ("UD_SEND_ONLY_WITH_IMMEDIATE", 12, "any")
    if op == 0x81:
        return ("CNP", 16, "none")                  # RoCEv2 CNP: 16 reserved bytes
    t = TRANSPORTS.get(op & 0xE0)
    o = OPERATIONS.get(op & 0x1F)
    if t is None or o is None or op & 0x1F > t[2]:
        return None
    if t[0] == "UC" and op & 0x1F > 0x0B:
        return None
    return ("%s_%s" % (t[0], o[0]), t[1] + o[1], o[2])


# --------------------------------------------------------------------------------------------
def ones_mask(length, spans):
    """A mask of `length` bytes: 0xFF inside each (start, end, bits) span's bits, else 0."""
    m = bytearray(length)
    for start, end, bits in spans:
        for i in range(start, end):
            m[i] |= bits
    return m


def apply_mask(data, mask):
    return bytes(b | m for b, m in zip(data, mask)) + bytes(data[len(mask):])


IPV4_VARIANT = [(1, 2, 0xFF), (8, 9, 0xFF), (10, 12, 0xFF)]      # TOS, TTL, checksum
IPV6_VARIANT = [(0, 1, 0x0F), (1, 4, 0xFF), (7, 8, 0xFF)]         # class, flow label, hops
UDP_VARIANT = [(6, 8, 0xFF)]                                      # checksum
BTH_VARIANT = [(4, 5, 0xFF)]                                      # FECN, BECN, resv6


def icrc(ip_header, udp_header, transport):
    """The ICRC of a RoCEv2 packet: `transport` is the UDP payload without its last 4 bytes."""
    spans = IPV4_VARIANT if ip_header[0] >> 4 == 4 else IPV6_VARIANT
    crc = zlib.crc32(LRH_STANDIN)
    crc = zlib.crc32(apply_mask(ip_header, ones_mask(len(ip_header), spans)), crc)
    crc = zlib.crc32(apply_mask(udp_header, ones_mask(8, UDP_VARIANT)), crc)
    crc = zlib.crc32(apply_mask(transport[:12], ones_mask(12, BTH_VARIANT)), crc)
    return zlib.crc32(transport[12:], crc) & 0xFFFFFFFF


def ipv4_header_sum_ok(header):
    total = 0
    for i in range(0, len(header), 2):
        total += (header[i] << 8) | header[i + 1]
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


# --------------------------------------------------------------------------------------------
class BadCapture(Exception):
    pass


def pcap_records(data):
    """(link type, frame bytes, original length) of each record of a classic pcap."""
    if len(data) < 24:
        raise BadCapture("shorter than a pcap file header")
    magic_le = struct.unpack("<I", data[:4])[0]
    if magic_le in (0xA1B2C3D4, 0xA1B23C4D):
        order = "<"
    elif magic_le in (0xD4C3B2A1, 0x4D3CB2A1):
        order = ">"
    else:
        raise BadCapture("not a pcap or pcapng file")
    link = struct.unpack(order + "I", data[20:24])[0] & 0xFFFF
    pos = 24
    while pos < len(data):
        if pos + 16 > len(data):
            raise BadCapture("record header cut at offset %d" % pos)
        incl, orig = struct.unpack(order + "II", data[pos + 8:pos + 16])
        if pos + 16 + incl > len(data):
            raise BadCapture("record cut at offset %d" % pos)
        yield link, data[pos + 16:pos + 16 + incl], orig
        pos += 16 + incl


def pcapng_records(data):
    """(link type, frame bytes, original length) of each packet block of a pcapng file."""
    pos, order, links = 0, "<", []
    while pos < len(data):
        if pos + 12 > len(data):
            raise BadCapture("block cut at offset %d" % pos)
        if data[pos:pos + 4] == b"\x0a\x0d\x0d\x0a":
            bom = data[pos + 8:pos + 12]
            if bom == b"\x4d\x3c\x2b\x1a":
                order = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                order = ">"
            else:
                raise BadCapture("section header with a bad byte-order magic")
            links = []
        kind, size = struct.unpack(order + "II", data[pos:pos + 8])
        if size < 12 or size % 4 or pos + size > len(data):
            raise BadCapture("bad block length %d at offset %d" % (size, pos))
        body = data[pos + 8:pos + size - 4]
        if kind == 1:                                   # interface description
            links.append(struct.unpack(order + "HHI", body[:8]))
        elif kind == 6:                                 # enhanced packet
            iface, _, _, incl, orig = struct.unpack(order + "IIIII", body[:20])
            yield links[iface][0], body[20:20 + incl], orig
        elif kind == 3:                                 # simple packet
            orig = struct.unpack(order + "I", body[:4])[0]
            snap = links[0][2] or orig
            yield links[0][0], body[4:4 + min(orig, snap)], orig
        pos += size


def capture_records(path):
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise BadCapture("empty file")
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        return pcapng_records(data)
    return pcap_records(data)


def ip_start(link, frame):
    """(ethertype, offset of the IP header) for the link layer, or None."""
    if link == 1:                                       # Ethernet
        if len(frame) < 14:
            return None
        pos = 12
        ethertype = (frame[pos] << 8) | frame[pos + 1]
        while ethertype in (0x8100, 0x88A8, 0x9100):    # VLAN tags
            pos += 4
            if len(frame) < pos + 2:
                return None
            ethertype = (frame[pos] << 8) | frame[pos + 1]
        return ethertype, pos + 2
    if link == 113 and len(frame) >= 16:                # Linux cooked v1
        return (frame[14] << 8) | frame[15], 16
    if link == 276 and len(frame) >= 20:                # Linux cooked v2
        return (frame[0] << 8) | frame[1], 20
    if link in (12, 14, 101) and frame:                 # raw IP
        return (0x0800 if frame[0] >> 4 == 4 else 0x86DD), 0
    if link == 228:
        return 0x0800, 0
    if link == 229:
        return 0x86DD, 0
    return None


# --------------------------------------------------------------------------------------------
def examine(link, frame, orig_len, port=ROCEV2_PORT, strict_pad=False, check_ip_csum=False):
    """None when the frame is not RoCEv2; else (icrc verdict: True/False/None when it cannot be
    judged, [malformation], description)."""
    at = ip_start(link, frame)
    if at is None:
        return None
    ethertype, off = at
    ip = frame[off:]
    problems = []
    if ethertype == 0x0800:
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            return None
        hlen = (ip[0] & 0x0F) * 4
        if hlen < 20 or len(ip) < hlen + 8:
            return None
        ip_total = (ip[2] << 8) | ip[3]
        udp_expect = ip_total - hlen
        if ((ip[6] << 8) | ip[7]) & 0x3FFF:
            problems.append("IPv4 fragment")
        if ip_total > len(ip) or ip_total < hlen + 8:
            problems.append("IPv4 total length %d, frame has %d IP bytes" % (ip_total, len(ip)))
        if check_ip_csum and not ipv4_header_sum_ok(ip[:hlen]):
            problems.append("IPv4 header checksum wrong")
    elif ethertype == 0x86DD:
        if len(ip) < 48 or ip[0] >> 4 != 6 or ip[6] != 17:
            return None
        hlen = 40
        udp_expect = (ip[4] << 8) | ip[5]
        if 40 + udp_expect > len(ip):
            problems.append("IPv6 payload length %d, frame has %d" % (udp_expect, len(ip) - 40))
    else:
        return None
    udp = ip[hlen:hlen + 8]
    sport, dport, ulen = struct.unpack("!HHH", udp[:6])
    if dport != port:
        return None
    if len(frame) < orig_len:
        return None, ["frame cut by the capture (%d of %d bytes)" % (len(frame), orig_len)], \
            "UDP %d -> %d" % (sport, dport)
    if ulen != udp_expect:
        problems.append("UDP length %d, IP says %d" % (ulen, udp_expect))
    if ulen < 8 + 12 + 4 or hlen + ulen > len(ip):
        problems.append("UDP datagram of %d bytes cannot hold BTH + ICRC in the frame" % ulen)
        return None, problems, "UDP %d -> %d, %d bytes" % (sport, dport, ulen)
    payload = ip[hlen + 8:hlen + ulen]
    transport, stored = payload[:-4], struct.unpack("<I", payload[-4:])[0]
    op = transport[0]
    pad = (transport[1] >> 4) & 3
    info = opcode_info(op)
    desc = "opcode 0x%02x %s, dqpn 0x%06x, psn 0x%06x, %d bytes" % (
        op, info[0] if info else "UNKNOWN", int.from_bytes(transport[5:8], "big"),
        int.from_bytes(transport[9:12], "big"), ulen)
    if transport[1] & 0x0F:
        problems.append("BTH TVer %d, must be 0" % (transport[1] & 0x0F))
    if len(transport) % 4:
        problems.append("transport length %d not a multiple of 4" % len(transport))
    if info is None:
        problems.append("unknown opcode 0x%02x" % op)
    else:
        _, ext, rule = info
        body = len(transport) - 12 - ext
        data = body - pad
        if body < 0:
            problems.append("%d bytes after the BTH cannot hold its %d-byte headers" % (len(transport) - 12, ext))
        elif data < 0:
            problems.append("pad count %d larger than the %d-byte payload" % (pad, body))
        elif rule == "full" and (pad or data == 0):
            problems.append("FIRST/MIDDLE packet with %d payload bytes and pad %d" % (data, pad))
        elif rule == "some" and data == 0:
            problems.append("LAST packet without payload")
        elif rule == "none" and body:
            problems.append("%d payload/pad bytes on an opcode without payload" % body)
        elif rule == "eight" and (data != 8 or pad):
            problems.append("ATOMIC_WRITE payload of %d bytes (pad %d), must be 8" % (data, pad))
        if strict_pad and pad and 0 <= data and any(transport[len(transport) - pad:]):
            problems.append("pad bytes not zero")
    want = icrc(ip[:hlen], udp, transport)
    if want != stored:
        desc += ", ICRC 0x%08x, computed 0x%08x" % (stored, want)
    return want == stored, problems, desc


class Tally:
    def __init__(self):
        self.checked = self.bad_icrc = self.malformed = 0
        self.lines = []
        self.per_opcode = {}

    def add(self, where, verdict, problems, desc, verbose):
        self.checked += 1
        key = desc.split(",")[0]
        self.per_opcode[key] = self.per_opcode.get(key, 0) + 1
        if problems:
            self.malformed += 1
            self.lines.append("%s: malformed: %s (%s)" % (where, "; ".join(problems), desc))
        if verdict is False:
            self.bad_icrc += 1
            self.lines.append("%s: bad ICRC (%s)" % (where, desc))
        elif verbose and not problems:
            self.lines.append("%s: ok (%s)" % (where, desc))


def check_path(path, tally, verbose=False, **kw):
    for n, (link, frame, orig) in enumerate(capture_records(path), 1):
        r = examine(link, frame, orig, **kw)
        if r is not None:
            tally.add("%s: frame %d" % (path, n), r[0], r[1], r[2], verbose)


# --------------------------------------------------------------------------------------------
def frame(transport, ipv=4, tos=0, ttl=64, flow=0, sport=49152, src=None, dst=None, ip_id=1):
    """An Ethernet frame carrying `transport` (BTH onwards, without ICRC), ICRC appended."""
    ulen = 8 + len(transport) + 4
    udp = struct.pack("!HHHH", sport, ROCEV2_PORT, ulen, 0)
    if ipv == 4:
        h = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + ulen, ip_id, 0x4000, ttl, 17, 0,
                                  src or bytes([10, 0, 0, 1]), dst or bytes([10, 0, 0, 2])))
        s = sum(struct.unpack("!10H", bytes(h)))
        while s > 0xFFFF:
            s = (s & 0xFFFF) + (s >> 16)
        h[10:12] = struct.pack("!H", ~s & 0xFFFF)
        ethertype = 0x0800
    else:
        h = struct.pack("!IHBB16s16s", (6 << 28) | (tos << 20) | flow, ulen, 17, ttl,
                        src or bytes(15) + b"\x01", dst or bytes(15) + b"\x02")
        ethertype = 0x86DD
    h = bytes(h)
    return (b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01" + struct.pack("!H", ethertype)
            + h + udp + transport + struct.pack("<I", icrc(h, udp, transport)))


def bth(op, dqpn, psn, pad=0, flags4=0, solicited=0, migreq=0, ack=0):
    return (bytes([op, (solicited << 7) | (migreq << 6) | (pad << 4)]) + b"\xff\xff"
            + bytes([flags4]) + dqpn.to_bytes(3, "big") + bytes([ack << 7]) + psn.to_bytes(3, "big"))


def selftest():
    failed = []

    def expect(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failed.append(what)

    # Known answers from outside pmrxe: a CNP with the ICRC a ConnectX-4 Lx computed in hardware
    # (published with scapy's RoCE tests), and scapy's own UC SEND_ONLY example.
    cnp = bytes.fromhex(
        "e41d2dab2bc27cfe90643b320800" "45c2003c718c400040119161" "0a0011010a001201"
        "000012b700280000" "8100ffff4000011800000000" + "00" * 16 + "82fd002a")
    r = examine(1, cnp, len(cnp))
    expect(r is not None and r[0] is True and not r[1], "ConnectX-4 Lx CNP verifies: %s" % (r,))
    uc = frame(bth(0x24, 211, 13571856, pad=2, migreq=1)
               + b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00",
               tos=1, src=bytes([192, 168, 0, 7]), dst=bytes([192, 168, 0, 7]), ip_id=1144)
    expect(uc[-4:] == bytes.fromhex("78f353f3"), "scapy UC_SEND_ONLY ICRC: %s" % uc[-4:].hex())

    # Variant fields do not enter the ICRC; any other bit does.
    for ipv in (4, 6):
        base = frame(bth(0x04, 0x11, 5, pad=1) + b"abc\x00", ipv=ipv)
        u = 14 + (20 if ipv == 4 else 40)
        variant = ([14 + 1, 14 + 8, 14 + 10, 14 + 11] if ipv == 4 else [14 + 1, 14 + 2, 14 + 3, 14 + 7]) \
            + [u + 6, u + 7, u + 8 + 4]
        for at in variant:
            b = bytearray(base)
            b[at] ^= 0x5A
            r = examine(1, bytes(b), len(b))
            expect(r[0] is True, "IPv%d: byte %d is masked" % (ipv, at))
        for at in [14 + 12 if ipv == 4 else 14 + 9, u + 1, u + 8 + 3, u + 8 + 7, u + 8 + 11, len(base) - 6]:
            b = bytearray(base)
            b[at] ^= 0x01
            expect(examine(1, bytes(b), len(b))[0] is False, "IPv%d: byte %d is covered" % (ipv, at))

    # Malformations are found, good packets pass.
    cases = [
        (frame(bth(0x04, 1, 1) + b"abc"), "multiple of 4"),
        (frame(bth(0x04, 1, 1, pad=1) + b"abc\x00"), None),
        (frame(bth(0x1F, 1, 1) + bytes(4)), "unknown opcode"),
        (frame(bth(0x07, 1, 1, pad=1) + b"abc\x00"), "FIRST/MIDDLE"),
        (frame(bth(0x11, 1, 1) + bytes(8)), "without payload"),
        (frame(bth(0x08, 1, 1)), "LAST packet"),
        (frame(bth(0x0C, 1, 1) + bytes(8)), "cannot hold"),
        (frame(bth(0x81, 1, 0, flags4=0x40) + bytes(16)), None),
        (frame(bytes([0x04, 0x01]) + bth(0x04, 1, 1)[2:]), "TVer"),
    ]
    for fr, want in cases:
        r = examine(1, fr, len(fr))
        text = "; ".join(r[1])
        expect(r[0] is True and ((want is None and not r[1]) or (want and want in text)),
               "frame %s: %s" % (fr[42:44].hex(), text or "clean"))
    nz = frame(bth(0x04, 1, 1, pad=1) + b"abc\x07")
    expect(not examine(1, nz, len(nz))[1] and examine(1, nz, len(nz), strict_pad=True)[1],
           "--strict-pad flags non-zero pad")
    bc = bytearray(frame(bth(0x04, 1, 1, pad=1) + b"abc\x00"))
    bc[14 + 10] ^= 0xFF
    expect(not examine(1, bytes(bc), len(bc))[1] and examine(1, bytes(bc), len(bc), check_ip_csum=True)[1],
           "--check-ip-csum flags a wrong IPv4 checksum")
    cut = frame(bth(0x04, 1, 1, pad=1) + b"abc\x00")
    r = examine(1, cut[:-8], len(cut))
    expect(r[0] is None and "cut" in r[1][0], "a cut frame is malformed, its ICRC not judged")

    # Both file formats, both byte orders.
    frames = [frame(bth(0x0A, 7, 9, ack=1) + bytes(16) + bytes(range(64)), ipv) for ipv in (4, 6)]
    for order in "<>":
        pcap = struct.pack(order + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"".join(
            struct.pack(order + "IIII", 1, 0, len(f), len(f)) + f for f in frames)
        got = [examine(l, f, o) for l, f, o in pcap_records(pcap)]
        expect(len(got) == 2 and all(g[0] is True and not g[1] for g in got), "pcap %s" % order)

        def block(kind, body):
            body += bytes(-len(body) % 4)
            return struct.pack(order + "II", kind, len(body) + 12) + body + struct.pack(order + "I", len(body) + 12)
        ng = block(0x0A0D0D0A, struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1)) \
            + block(1, struct.pack(order + "HHI", 1, 0, 0)) \
            + block(6, struct.pack(order + "IIIII", 0, 0, 0, len(frames[0]), len(frames[0])) + frames[0]) \
            + block(3, struct.pack(order + "I", len(frames[1])) + frames[1])
        got = [examine(l, f, o) for l, f, o in pcapng_records(ng)]
        expect(len(got) == 2 and all(g[0] is True and not g[1] for g in got), "pcapng %s" % order)

    print("selftest: %s (%d failed)" % ("PASSED" if not failed else "FAILED", len(failed)))
    return 1 if failed else 0


def main(argv):
    opts = {"port": ROCEV2_PORT, "strict_pad": False, "check_ip_csum": False}
    verbose, paths = False, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--selftest":
            return selftest()
        if a == "-v":
            verbose = True
        elif a == "--strict-pad":
            opts["strict_pad"] = True
        elif a == "--check-ip-csum":
            opts["check_ip_csum"] = True
        elif a == "--port" and args:
            opts["port"] = int(args.pop(0))
        elif a.startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            paths.append(a)
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    tally = Tally()
    for p in paths:
        try:
            check_path(p, tally, verbose, **opts)
        except (OSError, BadCapture, struct.error, IndexError) as e:
            tally.lines.append("%s: cannot read the capture: %s" % (p, e))
            tally.malformed += 1
    for line in tally.lines:
        print(line)
    if verbose:
        for k in sorted(tally.per_opcode):
            print("  %6d  %s" % (tally.per_opcode[k], k))
    print("checked %d packets, %d bad ICRC, %d malformed" % (tally.checked, tally.bad_icrc, tally.malformed))
    return 0 if tally.checked and not tally.bad_icrc and not tally.malformed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
