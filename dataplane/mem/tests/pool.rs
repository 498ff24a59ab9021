//! Hugepage pool: fallback to 4 KiB pages when no hugepages are reserved, chunk reuse, and
//! sharing through the memfd. Does not change the machine's hugepage settings.

use pmrxe_mem::*;

fn free_hugepages_2m() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn pool_falls_back_to_small_pages_without_hugepages() {
    let pool = HugePool::new(4 << 20, PagePref::Huge2M).unwrap();
    if free_hugepages_2m() < 2 {
        assert!(!pool.is_huge(), "nr_hugepages=0 must fall back");
        assert_eq!(pool.page_size(), 4096);
    } else {
        assert!(pool.is_huge());
        assert_eq!(pool.page_size(), 2 << 20);
    }
    assert!(pool.len() >= 4 << 20);
    assert_eq!(pool.region().addr() % pool.page_size() as u64, 0);
}

#[test]
fn pool_small_and_1g_pref() {
    let p = HugePool::new(10_000, PagePref::Small).unwrap();
    assert_eq!((p.page_size(), p.len()), (4096, 12288));
    // A pool smaller than 1 GiB never asks for 1 GiB pages; with none reserved it falls back.
    let p = HugePool::new(1 << 20, PagePref::Huge1G).unwrap();
    assert!(p.len() >= 1 << 20);
}

#[test]
fn pool_chunks_register_and_are_reused() {
    let pool = HugePool::new(1 << 20, PagePref::Huge2M).unwrap();
    let a = pool.alloc(600 << 10, 4096).unwrap();
    assert!(pool.alloc(600 << 10, 4096).is_none(), "exhausted");
    let b = pool.alloc(64 << 10, 64 << 10).unwrap();
    assert_eq!(b.addr() % (64 << 10), 0);
    a.write(100, b"hello").unwrap();
    let t = MemTable::new(MemLimits::default());
    let k = t.reg_mr(1, a.clone(), 0, Access::LOCAL_WRITE).unwrap();
    let mut buf = [0u8; 5];
    t.lookup(k, 1, 0, 100, 5, Access::EMPTY)
        .unwrap()
        .copy_out(100, &mut buf)
        .unwrap();
    assert_eq!(&buf, b"hello");
    // The memfd shares the bytes (what a client would map).
    let off = pool.offset_of(&a).unwrap();
    let view = Region::map_fd(pool.fd(), off, 4096).unwrap();
    let mut buf = [0u8; 5];
    view.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    // The MR keeps the chunk alive; after dereg and drop it returns to the pool.
    drop(a);
    assert!(pool.alloc(600 << 10, 4096).is_none());
    t.dereg_mr(k).unwrap();
    assert!(pool.alloc(600 << 10, 4096).is_some());
}
