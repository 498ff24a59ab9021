//! One-pass copies with CRC (`gather_crc`, `scatter_crc`, `MrRef::copy_{in,out}_crc`): the
//! bytes moved are those of the plain copies and the CRC is crc32fast's of those bytes, through
//! contiguous user MRs and through fast-reg MRs whose pages are mapped out of order (every
//! page boundary is a jump in memory), at arbitrary offsets and lengths.

use pmrxe_mem::*;
use proptest::prelude::*;

const PD: PdHandle = 3;
const QPN: u32 = 0x21;
const PG: usize = 4096;
const PAGES: usize = 6;
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

fn reference(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

struct Fixture {
    t: MemTable,
    /// Contiguous user MR at iova 0x10000.
    user: Key,
    /// Fast-reg MR over PAGES pages of `backing`, mapped in reverse order.
    paged: Key,
    paged_iova: u64,
    backing: Region,
}

fn fixture() -> Fixture {
    let t = MemTable::new(MemLimits { max_mr: 8, max_mw: 8, max_fast_reg_pages: 64, page_slots: 1 << 10, ..MemLimits::default() });
    let user = t.reg_mr(PD, Region::zeroed(PAGES * PG), 0x10000, RW).unwrap();
    let big = Region::zeroed((PAGES + 1) * PG);
    let off = (PG - big.addr() as usize % PG) % PG;
    let backing = big.slice(off, PAGES * PG).unwrap();
    let k = t.alloc_mr(PD, PAGES as u32).unwrap();
    let sg: Vec<SgEntry> = (0..PAGES).rev().map(|i| SgEntry { region: &backing, offset: i * PG, len: PG }).collect();
    assert_eq!(t.map_mr_sg(k, &sg, 0, PG as u64).unwrap(), PAGES);
    let paged = k.inc();
    t.exec_reg_mr(PD, paged, RW, None, None).unwrap();
    let paged_iova = t.query(paged).unwrap().iova;
    Fixture { t, user, paged, paged_iova, backing }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn copy_in_and_out_crc_through_scrambled_pages(at in 0usize..PAGES * PG, len in 0usize..3 * PG, init: u32, seed: u8) {
        let f = fixture();
        let len = len.min(PAGES * PG - at);
        let data = pattern(len, seed);
        let va = f.paged_iova + at as u64;
        let r = f.t.lookup(f.paged, PD, QPN, va, len as u64, Access::LOCAL_WRITE).unwrap();
        prop_assert_eq!(r.copy_in_crc(va, &data, init).unwrap(), reference(init, &data));
        let mut back = vec![0u8; len];
        r.copy_out(va, &mut back).unwrap();
        prop_assert_eq!(&back, &data);
        let mut again = vec![0u8; len];
        prop_assert_eq!(r.copy_out_crc(va, &mut again, init).unwrap(), reference(init, &data));
        prop_assert_eq!(&again, &data);
        // Page i of the MR is page PAGES-1-i of the backing: check one byte landed there.
        if len > 0 {
            let (page, po) = (at / PG, at % PG);
            let mut b = [0u8; 1];
            f.backing.read((PAGES - 1 - page) * PG + po, &mut b).unwrap();
            prop_assert_eq!(b[0], data[0]);
        }
    }

    #[test]
    fn gather_and_scatter_crc_match_the_plain_copies(off in 0u64..4000, len in 0usize..4000, init: u32, seed: u8) {
        let f = fixture();
        // Two SGEs: the tail of the paged MR, then the user MR.
        let sges = [
            Sge { addr: f.paged_iova + (PAGES * PG - 3000) as u64, len: 3000, lkey: f.paged },
            Sge { addr: 0x10000 + 100, len: 5000, lkey: f.user },
        ];
        let data = pattern(len, seed);
        let c = scatter_crc(&f.t, PD, QPN, &sges, off, &data, init).unwrap();
        prop_assert_eq!(c, reference(init, &data));
        let mut plain = vec![0u8; len];
        gather(&f.t, PD, QPN, &sges, off, &mut plain).unwrap();
        prop_assert_eq!(&plain, &data);
        let mut fused = vec![0u8; len];
        prop_assert_eq!(gather_crc(&f.t, PD, QPN, &sges, off, &mut fused, init).unwrap(), reference(init, &data));
        prop_assert_eq!(&fused, &data);
    }

    #[test]
    fn one_sge_copies_agree_with_the_list_walk(off in 0u64..6000, len in 0usize..6000, init: u32, seed: u8, bad_key: bool, paged: bool) {
        // A single SGE takes a shortcut past the walk over the list in gather, scatter and
        // their CRC forms. The same SGE followed by an empty one takes the walk: bytes moved,
        // CRCs and errors (their kind and precedence: a bad key, a range past the SGE) must
        // be equal, in range or not, through a contiguous and a page-scrambled MR.
        let lists = |f: &Fixture| {
            let (addr, key) = if paged { (f.paged_iova + 100, f.paged) } else { (0x10000 + 100, f.user) };
            let lkey = if bad_key { key.inc() } else { key };
            let s = Sge { addr, len: 5000, lkey };
            (vec![s], vec![s, Sge { addr, len: 0, lkey }], Sge { addr, len: 5000, lkey: key })
        };
        let data = pattern(len, seed);
        // Scatter: each form into its own fixture, then the 5000 bytes read back.
        let mut after = Vec::new();
        for (crc_form, walked) in [(false, false), (false, true), (true, false), (true, true)] {
            let f = fixture();
            let (one, two, whole) = lists(&f);
            let sges = if walked { two } else { one };
            let r = if crc_form {
                scatter_crc(&f.t, PD, QPN, &sges, off, &data, init).map(Some)
            } else {
                scatter(&f.t, PD, QPN, &sges, off, &data).map(|()| None)
            };
            let mut mem = vec![0u8; 5000];
            gather(&f.t, PD, QPN, &[whole], 0, &mut mem).unwrap();
            after.push((r, mem));
        }
        prop_assert_eq!(&after[0], &after[1], "scatter");
        prop_assert_eq!(&after[2], &after[3], "scatter_crc");
        if let Ok(Some(c)) = after[2].0 {
            prop_assert_eq!(c, reference(init, &data));
        }
        // Gather: from one filled fixture.
        let f = fixture();
        let (one, two, whole) = lists(&f);
        scatter(&f.t, PD, QPN, &[whole], 0, &pattern(5000, seed ^ 0x5A)).unwrap();
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        prop_assert_eq!(gather(&f.t, PD, QPN, &one, off, &mut a), gather(&f.t, PD, QPN, &two, off, &mut b), "gather");
        prop_assert_eq!(&a, &b);
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        let ra = gather_crc(&f.t, PD, QPN, &one, off, &mut a, init);
        prop_assert_eq!(ra, gather_crc(&f.t, PD, QPN, &two, off, &mut b, init), "gather_crc");
        prop_assert_eq!(&a, &b);
        if let Ok(c) = ra {
            prop_assert_eq!(c, reference(init, &a));
        }
    }
}

#[test]
fn crc_copies_check_keys_and_ranges_like_the_plain_ones() {
    let f = fixture();
    let sges = [Sge { addr: 0x10000, len: 100, lkey: f.user }];
    let mut out = [0u8; 101];
    assert_eq!(gather_crc(&f.t, PD, QPN, &sges, 0, &mut out, 0), Err(MemError::OutOfRange));
    assert_eq!(gather_crc(&f.t, PD + 1, QPN, &sges, 0, &mut out[..10], 0), Err(MemError::PdMismatch));
    let bad = [Sge { addr: 0x10000, len: 100, lkey: f.user.inc() }];
    assert!(scatter_crc(&f.t, PD, QPN, &bad, 0, &[1, 2, 3], 0).is_err());
    let r = f.t.lookup(f.user, PD, QPN, 0x10000, 16, Access::LOCAL_WRITE).unwrap();
    assert_eq!(r.copy_in_crc(0x10000 + 8, &[0u8; 16], 0), Err(MemError::OutOfRange));
}
