//! `pmrxe` — the one binary: the service, the verbs launcher and the operator tools.
//!
//! Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad configuration (one line on
//! stderr naming the field).
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "pmrxe",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PMRXE_GIT_REV"), ")"),
    about = "Userspace poll-mode software RoCEv2 data plane with a libibverbs-compatible shim",
    long_about = "pmrxe runs RoCEv2 on pinned, busy-polling cores over DPDK ports and gives unmodified \
libibverbs programs a verbs device (pmrxe0, pmrxe1, ...).\n\nQuick start:\n  pmrxe serve &                 # embedded default: configs/loopback.toml\n  pmrxe run -- ibv_devinfo -v   # any verbs program, unmodified\n\nPMRXE_SOCKET overrides the control socket path for every subcommand and for the shim."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the data-plane service (EAL, ports, poll-mode lcores, control socket).
    Serve {
        /// Configuration file (TOML). Default: the embedded loopback configuration.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Serve Prometheus metrics at http://ADDR/metrics (overrides service.metrics).
        /// ADDR is host:port, or just a port for 127.0.0.1:PORT.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
    },
    /// Run an unmodified verbs program against the service (LD_PRELOAD of the shim).
    Run {
        /// Control socket of the service (default: $PMRXE_SOCKET, else the config default).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Also preload librdmacm's rsockets (librspreload.so, package librdmacm1, or
        /// $PMRXE_RSPRELOAD) after the shim: the program's TCP sockets become rsockets over
        /// pmrxe. Its ibv_*/rdma_* calls reach the shim, which comes first.
        #[arg(long)]
        rsocket: bool,
        /// Program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<String>,
    },
    /// Show service counters: devices/ports, lcores, QPs.
    Stats {
        /// Machine-readable JSON.
        #[arg(long)]
        json: bool,
        /// Refresh every N seconds until interrupted.
        #[arg(long, value_name = "SECS")]
        watch: Option<f64>,
        /// Control socket (default: $PMRXE_SOCKET, else /run/pmrxe/pmrxe.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Capture what the lcores send and receive into a pcap file.
    Capture {
        /// Output file (classic pcap, Ethernet).
        #[arg(long, short)]
        out: PathBuf,
        /// Stop after N frames (0 = until interrupted).
        #[arg(long, short = 'c', default_value_t = 0)]
        count: u64,
        /// Only frames of this QP number (either direction). Users other than root and the
        /// service user must name one of their own QPs: whole-port capture is root's.
        #[arg(long)]
        qp: Option<u32>,
        /// Replace an existing output file (it is never followed if it is a symbolic link;
        /// without --force an existing file is an error). The file is created mode 0600.
        #[arg(long)]
        force: bool,
        /// Control socket (default: $PMRXE_SOCKET, else /run/pmrxe/pmrxe.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Wire-format tools.
    Wire {
        #[command(subcommand)]
        cmd: WireCmd,
    },
    /// Smoke-test the DPDK path: send N frames across a pair of ports and verify them.
    PortTest {
        /// Configuration file with at least two ports (default: embedded loopback).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Frames to send.
        #[arg(long, default_value_t = 100_000)]
        frames: u64,
    },
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// Native benchmark harness (no shim): message rate, bandwidth and latency on loopback.
    Bench(Box<cmd::bench::BenchArgs>),
}

#[derive(Subcommand)]
enum WireCmd {
    /// Write one RoCEv2 packet of every opcode (RC, UC, UD; IPv4 and IPv6) to a pcap file.
    Sample {
        /// Output pcap file.
        #[arg(long, short)]
        out: PathBuf,
        /// Seed for the randomised field values.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Validate a configuration file and print a summary.
    Check {
        /// The file to check.
        file: PathBuf,
    },
    /// Print the embedded default configuration.
    Default,
}

fn main() -> ExitCode {
    // A CLI writing into a closed pipe (`pmrxe stats --watch 1 | head -1`) should end quietly
    // like any Unix tool, not panic: restore the default SIGPIPE action Rust overrides.
    // `pmrxe serve` sets it back to SIG_IGN first thing (pmrxe_service::serve): a client going
    // away must never kill the service.
    // SAFETY: setting a signal disposition to SIG_DFL at start-up, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve { config, metrics } => cmd::serve::run(config, metrics),
        Cmd::Run { socket, rsocket, program } => cmd::run::run(socket, rsocket, program),
        Cmd::Stats { json, watch, socket } => cmd::stats::run(json, watch, socket),
        Cmd::Capture { out, count, qp, force, socket } => cmd::stats::capture(out, count, qp, force, socket),
        Cmd::Wire { cmd: WireCmd::Sample { out, seed } } => cmd::wire::sample(out, seed),
        Cmd::PortTest { config, frames } => cmd::port_test::run(config, frames),
        Cmd::Config { cmd: ConfigCmd::Check { file } } => cmd::config::check(file),
        Cmd::Config { cmd: ConfigCmd::Default } => {
            print!("{}", pmrxe_config::DEFAULT_LOOPBACK);
            ExitCode::SUCCESS
        }
        Cmd::Bench(args) => cmd::bench::run(*args),
    }
}
