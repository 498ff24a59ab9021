//! Fuzz the control-protocol decoder the service runs on every client message: hostile bytes
//! must give an error, never a panic or an unbounded allocation; whatever decodes must
//! re-encode and decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmrxe_abi::ctrl::{decode, encode, Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode::<Request>(data) {
        let bytes = encode(&req).expect("a decoded request re-encodes");
        assert_eq!(decode::<Request>(&bytes).expect("re-encoded request decodes"), req);
    }
    let _ = decode::<Response>(data);
});
