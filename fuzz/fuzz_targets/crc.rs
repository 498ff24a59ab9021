//! Fuzz the CRC kernels (`pmrxe-crc`): for any bytes, length, source/destination alignment and
//! initial CRC, every kernel this CPU has gives crc32fast's CRC, `copy_and_crc` copies exactly
//! the source and nothing around it, and `crc32_combine` of a split equals the CRC of the whole.
//!
//! Input: `[init u32 LE][src offset u8][dst offset / split u8][bytes...]`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmrxe_crc::{crc32_combine, Kernel};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let init = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let body = &data[6..];
    let src = &body[(usize::from(data[4]) % 64).min(body.len())..];
    let doff = usize::from(data[5]) % 64;
    let mut h = crc32fast::Hasher::new_with_initial(init);
    h.update(src);
    let want = h.finalize();
    for k in Kernel::available() {
        assert_eq!(k.crc_update(init, src), want, "{}", k.name());
        let mut dst = vec![0x5Au8; doff + src.len() + 64];
        assert_eq!(k.copy_and_crc(init, &mut dst[doff..doff + src.len()], src), want, "{}", k.name());
        assert_eq!(&dst[doff..doff + src.len()], src);
        assert!(dst[..doff].iter().chain(&dst[doff + src.len()..]).all(|&b| b == 0x5A));
    }
    let split = usize::from(data[5]) * src.len() / 255;
    let (a, b) = src.split_at(split);
    assert_eq!(crc32_combine(crc32fast::hash(a), crc32fast::hash(b), b.len() as u64), crc32fast::hash(src));
});
