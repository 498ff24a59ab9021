//! `pmrxe wire sample --out F`.
use std::path::PathBuf;
use std::process::ExitCode;

pub fn sample(out: PathBuf, seed: u64) -> ExitCode {
    match pmrxe_wire::write_sample(&out, seed) {
        Ok(n) => {
            println!("wrote {n} RoCEv2 frames to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::fail(&format!("writing {}", out.display()), e),
    }
}
