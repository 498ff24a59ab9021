//! Calibration and the installed best kernel (a process of its own: installing changes what
//! the free functions use for every thread, and `PMRXE_CRC_KERNEL` is set here).

use std::time::Duration;

use pmrxe_crc::{copy_and_crc, crc_update, crc_update_masked, Kernel};

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8).collect()
}

/// The free functions agree with crc32fast whatever kernel is installed.
fn free_functions_correct() {
    let src = pattern(5000);
    for len in [0usize, 3, 12, 44, 64, 100, 255, 256, 257, 1000, 4096, 5000] {
        let want = crc32fast::hash(&src[..len]);
        let mut dst = vec![0u8; len];
        assert_eq!(copy_and_crc(0, &mut dst, &src[..len]), want, "{} len {len}", Kernel::best().name());
        assert_eq!(dst, src[..len]);
        assert_eq!(crc_update(0, &src[..len]), want);
        assert_eq!(crc_update_masked(0, &src[..len], &[0; 4]), want);
    }
}

#[test]
fn calibrate_install_set_best_and_forcing() {
    // One test function: the steps share the process-wide choice and the environment.
    std::env::remove_var("PMRXE_CRC_KERNEL");
    assert_eq!(Some(Kernel::best()), Kernel::available().last(), "before calibration: the widest");
    let cal = Kernel::calibrate(4096, Duration::from_millis(20));
    eprintln!("{cal:?}");
    let names: Vec<Kernel> = cal.gb_per_s.iter().map(|&(k, _)| k).collect();
    assert_eq!(names, Kernel::available().collect::<Vec<_>>());
    assert!(cal.gb_per_s.iter().all(|&(_, g)| g > 0.0), "{cal:?}");
    let top = cal.gb_per_s.iter().map(|&(_, g)| g).fold(0.0, f64::max);
    assert!(cal.gb_per_s_of(cal.fastest).unwrap() >= top * 0.97, "{cal:?}");
    assert!(!cal.is_forced());
    assert_eq!(cal.install(), cal.fastest);
    assert_eq!(Kernel::best(), cal.fastest);
    free_functions_correct();

    // Every kernel installed in turn, then forcing.
    for k in Kernel::available() {
        assert_eq!(Kernel::set_best(k), k);
        assert_eq!(Kernel::best(), k);
        free_functions_correct();
    }
    std::env::set_var("PMRXE_CRC_KERNEL", "portable");
    assert_eq!(Kernel::forced(), Some(Kernel::PORTABLE));
    let widest = Kernel::available().last().unwrap();
    assert_eq!(Kernel::set_best(widest), Kernel::PORTABLE, "the forced kernel wins");
    assert_eq!(Kernel::best(), Kernel::PORTABLE);
    let cal = Kernel::calibrate(1024, Duration::from_millis(5));
    assert!(cal.is_forced());
    assert_eq!(cal.chosen(), Kernel::PORTABLE);
    assert_eq!(cal.install(), Kernel::PORTABLE);
    free_functions_correct();
    // A name this CPU lacks (or nonsense) forces nothing.
    std::env::set_var("PMRXE_CRC_KERNEL", "nonsense");
    assert_eq!(Kernel::forced(), None);
    assert_eq!(Kernel::set_best(widest), widest);
    std::env::remove_var("PMRXE_CRC_KERNEL");
}
