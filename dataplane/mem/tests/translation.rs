//! Property tests: translation through a fast-reg MR against a byte-level reference model,
//! and `sg_to_pages` against the "page list reproduces the concatenated bytes" invariant.

use pmrxe_mem::map::sg_to_pages;
use pmrxe_mem::*;
use proptest::prelude::*;

const PD: PdHandle = 1;
const NPAGES: usize = 12;

/// Elements as (first page, page count); first gets `sg_offset`, last is trimmed by `trim`.
fn layout() -> impl Strategy<Value = (u32, Vec<(usize, usize)>, u64, u64, u32)> {
    (
        prop_oneof![Just(12u32), Just(13u32), Just(16u32)],
        prop::collection::vec((0..NPAGES, 1..=3usize), 1..6),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(shift, els, o, t, hi)| {
            let els: Vec<(usize, usize)> = els
                .into_iter()
                .map(|(p, c)| (p, c.min(NPAGES - p)))
                .collect();
            (shift, els, o, t, hi)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn translation_matches_reference(
        (shift, els, o, trim, hi) in layout(),
        accesses in prop::collection::vec((any::<u64>(), 0..9000u64), 8),
    ) {
        let ps = 1usize << shift;
        let big = Region::zeroed((NPAGES + 1) * ps);
        let a = (ps - big.addr() as usize % ps) % ps;
        let mem = big.slice(a, NPAGES * ps).unwrap();
        let pat: Vec<u8> = (0..NPAGES * ps).map(|i| (i * 7 + i / 251) as u8).collect();
        mem.write(0, &pat).unwrap();

        let first_len = els[0].1 * ps;
        let sg_offset = o % first_len as u64;
        let last = els.len() - 1;
        let last_len = els[last].1 * ps - if last == 0 { 0 } else { (trim % (els[last].1 * ps) as u64) as usize };
        let sg: Vec<SgEntry> = els.iter().enumerate().map(|(i, &(p, c))| SgEntry {
            region: &mem, offset: p * ps, len: if i == last { last_len } else { c * ps },
        }).collect();
        // Reference: byte j of the MR is region offset refmap[j].
        let mut refmap = Vec::new();
        for (i, e) in sg.iter().enumerate() {
            let skip = if i == 0 { sg_offset as usize } else { 0 };
            refmap.extend(e.offset + skip..e.offset + e.len);
        }
        let t = MemTable::new(MemLimits { max_mr: 2, max_mw: 1, page_slots: 64, ..MemLimits::default() });
        let k = t.alloc_mr(PD, 16).unwrap();
        prop_assert_eq!(t.map_mr_sg(k, &sg, sg_offset, ps as u64).unwrap(), sg.len());
        let mapped = t.query(k).unwrap().next_iova;
        prop_assert_eq!(mapped, mem.addr() + (els[0].0 * ps) as u64 + sg_offset);
        // xprtrdma-style rewrite of the upper 32 bits.
        let iova = ((hi as u64) << 32) | (mapped & 0xffff_ffff);
        t.set_fast_reg_iova(k, iova).unwrap();
        t.exec_reg_mr(PD, k, Access::LOCAL_WRITE | Access::REMOTE_READ, None, None).unwrap();
        let info = t.query(k).unwrap();
        prop_assert_eq!(info.length, refmap.len() as u64);
        for (start, len) in accesses {
            let off = start % (refmap.len() as u64 + 64);
            let va = iova.wrapping_add(off);
            let r = t.lookup(k, PD, 0, va, len, Access::REMOTE_READ);
            let fits = len > 0 && off.checked_add(len).is_some_and(|e| e <= refmap.len() as u64);
            if len == 0 {
                prop_assert!(r.is_ok());
                continue;
            }
            if va.checked_add(len).is_none() {
                prop_assert_eq!(r.unwrap_err(), MemError::Overflow);
                continue;
            }
            if !fits {
                prop_assert_eq!(r.unwrap_err(), MemError::OutOfRange);
                continue;
            }
            let mut buf = vec![0u8; len as usize];
            r.unwrap().copy_out(va, &mut buf).unwrap();
            let want: Vec<u8> = refmap[off as usize..(off + len) as usize].iter().map(|&i| pat[i]).collect();
            prop_assert_eq!(buf, want);
        }
    }

    /// For arbitrary (address, length) lists: every mapped byte j translates, through the
    /// emitted page list, to the j-th byte of the concatenated elements; and mapping stopped
    /// only where the rules say it must.
    #[test]
    fn sg_to_pages_reproduces_concatenation(
        shift in 12u32..=14,
        raw in prop::collection::vec((0u64..64, 0u64..3, 0u64..4, 1u64..3), 1..7),
        sg_off in 0u64..5000,
        max_pages in 1usize..24,
    ) {
        let ps = 1u64 << shift;
        // Mix of page-aligned, contiguous and gapped elements.
        let mut els: Vec<(u64, u64)> = Vec::new();
        let mut prev_end = 0x10_0000u64;
        for (page, kind, sub, cnt) in raw {
            let len = cnt * ps - if kind == 2 { sub * 100 } else { 0 };
            let addr = match kind {
                0 => 0x10_0000 + page * ps,          // aligned
                1 => prev_end,                        // contiguous
                _ => 0x10_0000 + page * ps + sub * 8, // possibly unaligned
            };
            els.push((addr, len.max(1)));
            prev_end = addr + len.max(1);
        }
        let mut pages = vec![0u64; max_pages];
        let res = sg_to_pages(els.iter().copied(), sg_off, ps, max_pages, |i, a| pages[i] = a);
        if sg_off >= els[0].1 {
            prop_assert!(res.is_err());
            return Ok(());
        }
        let m = match res {
            Ok(m) => m,
            Err(e) => { prop_assert_eq!(e, MemError::TooManyPages); return Ok(()); }
        };
        prop_assert!(m.entries >= 1 && m.npages <= max_pages);
        let mut concat = Vec::new();
        for (i, &(a, l)) in els[..m.entries].iter().enumerate() {
            let s = if i == 0 { sg_off } else { 0 };
            concat.extend(a + s..a + l);
        }
        prop_assert_eq!(m.length, concat.len() as u64);
        prop_assert_eq!(m.iova, els[0].0 + sg_off);
        for (j, &want) in concat.iter().enumerate() {
            let va = m.iova + j as u64;
            let idx = ((va >> shift) - (m.iova >> shift)) as usize;
            prop_assert!(idx < m.npages);
            prop_assert_eq!(pages[idx] + (va & (ps - 1)), want);
        }
        if m.entries < els.len() {
            // Either a gap rule or capacity stopped it.
            let (pe, (a, _)) = (els[m.entries - 1].0 + els[m.entries - 1].1, els[m.entries]);
            let unaligned = pe % ps != 0 || a % ps != 0;
            let gap = unaligned && a != pe;
            let (a2, l2) = els[m.entries];
            let first_new = if unaligned { pe.div_ceil(ps) * ps } else { a2 };
            let need = if a2 + l2 > first_new { ((a2 + l2 - 1) >> shift) - (first_new >> shift) + 1 } else { 0 };
            let full = m.npages + need as usize > max_pages;
            prop_assert!(gap || full, "stopped without reason at {}", m.entries);
        }
    }
}
