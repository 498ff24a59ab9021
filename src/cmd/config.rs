//! `pmrxe config check FILE`.
use std::path::PathBuf;
use std::process::ExitCode;

pub fn check(file: PathBuf) -> ExitCode {
    let cfg = match super::load_config(Some(&file)) {
        Ok(c) => c,
        Err(code) => return code,
    };
    println!(
        "{}: ok: {} port(s) [{}], lcores on cpus {:?}, hugepages {}, socket {}{}",
        file.display(),
        cfg.ports.len(),
        cfg.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
        cfg.lcores.cores,
        if cfg.eal.hugepages { "on" } else { "off" },
        cfg.socket_path().display(),
        cfg.service.metrics.map(|a| format!(", metrics http://{a}/metrics")).unwrap_or_default()
    );
    ExitCode::SUCCESS
}
