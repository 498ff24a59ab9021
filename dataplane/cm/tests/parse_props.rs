//! Property tests: the MAD parser never panics, refuses anything short of 256 bytes, and every
//! message it accepts re-emits to the same bytes it was parsed from (modulo reserved bits).

use pmrxe_cm::msg::{emit_mad, parse_mad, CmMsg};
use pmrxe_cm::Error;
use proptest::prelude::*;

/// A 256-byte MAD with a valid CM header and a chosen attribute ID, random data.
fn cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (0x10u16..=0x18, any::<u64>(), proptest::collection::vec(any::<u8>(), 232)).prop_map(|(attr, tid, data)| {
        let mut m = vec![1, 7, 2, 3, 0, 0, 0, 0];
        m.extend_from_slice(&tid.to_be_bytes());
        m.extend_from_slice(&attr.to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        m.extend_from_slice(&data);
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_mad(&b);
    }

    #[test]
    fn truncated_cm_mads_are_refused(m in cm_mad(), cut in 0usize..256) {
        prop_assert!(parse_mad(&m[..cut]).is_err());
    }

    #[test]
    fn accepted_mads_reemit_and_reparse_identically(m in cm_mad()) {
        match parse_mad(&m) {
            Ok((h, msg)) => {
                let again = emit_mad(h.tid, h.attr_mod, &msg).unwrap();
                let (h2, msg2) = parse_mad(&again).unwrap();
                prop_assert_eq!(h, h2);
                prop_assert_eq!(&msg, &msg2);
                // Everything the parser exposes is the same bytes: only reserved bits may
                // differ between the random input and our re-emission.
                let diff = m.iter().zip(again.iter()).filter(|(a, b)| a != b).count();
                prop_assert!(diff <= 232, "{}", diff);
                if let CmMsg::Req(r) = &msg {
                    prop_assert_eq!(&again[24 + 140..], &r.private_data[..]);
                }
            }
            Err(e) => prop_assert!(matches!(e, Error::BadField), "{:?}", e),
        }
    }
}
