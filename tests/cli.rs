//! The `pmrxe` command line: every `--help` exits 0 and names its options; `pmrxe config
//! check` accepts the shipped configurations and rejects bad ones with exit status 2 and one
//! line on stderr naming the field. Nothing here starts EAL or a service.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pmrxe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmrxe")).args(args).env_remove("RUST_LOG").output().expect("run pmrxe")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `pmrxe ARGS --help` exits 0 and its output mentions every string in `want`.
fn help_mentions(args: &[&str], want: &[&str]) {
    let mut a = args.to_vec();
    a.push("--help");
    let o = pmrxe(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "pmrxe {} --help: {}\n{out}{err}", args.join(" "), o.status);
    for w in want {
        assert!(out.contains(w), "pmrxe {} --help does not mention {w:?}:\n{out}", args.join(" "));
    }
}

#[test]
fn top_level_help_lists_every_subcommand() {
    help_mentions(&[], &["serve", "run", "stats", "capture", "wire", "port-test", "config", "bench", "PMRXE_SOCKET"]);
    let o = pmrxe(&["--version"]);
    assert!(o.status.success());
    assert!(text(&o).0.starts_with("pmrxe "), "{:?}", text(&o));
}

#[test]
fn every_subcommand_help_exits_0_and_names_its_options() {
    help_mentions(&["serve"], &["--config", "--metrics"]);
    help_mentions(&["run"], &["--socket", "--rsocket", "PROGRAM"]);
    help_mentions(&["stats"], &["--json", "--watch", "--socket"]);
    help_mentions(&["capture"], &["--out", "--count", "--qp", "--socket"]);
    help_mentions(&["wire"], &["sample"]);
    help_mentions(&["wire", "sample"], &["--out", "--seed"]);
    help_mentions(&["port-test"], &["--config", "--frames"]);
    help_mentions(&["config"], &["check", "default"]);
    help_mentions(&["config", "check"], &["FILE"]);
    help_mentions(&["config", "default"], &[]);
    help_mentions(&["bench"], &["Usage: pmrxe bench"]);
}

/// Every subcommand that `pmrxe --help` lists has a working `--help` (catches a subcommand
/// added later without being covered above).
#[test]
fn every_listed_subcommand_has_help() {
    let (out, _) = text(&pmrxe(&["--help"]));
    let cmds: Vec<String> = out
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(cmds.len() >= 8, "too few subcommands parsed from --help:\n{out}");
    for c in &cmds {
        help_mentions(&[c], &["Usage:"]);
    }
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(pmrxe(&["no-such-subcommand"]).status.code(), Some(2));
    assert_eq!(pmrxe(&["stats", "--no-such-flag"]).status.code(), Some(2));
    assert_eq!(pmrxe(&["serve", "--metrics", "not an address"]).status.code(), Some(2));
}

fn check(file: &Path) -> (Option<i32>, String, String) {
    let o = pmrxe(&["config", "check", file.to_str().unwrap()]);
    let (out, err) = text(&o);
    (o.status.code(), out, err)
}

#[test]
fn config_check_accepts_the_shipped_configs() {
    // nic-example.toml needs free hugepages and CPUs 2-3, which `config check` verifies
    // against this machine, so it is only parsed here (below).
    for name in ["loopback", "netns-a", "netns-b", "memif-server", "memif-client"] {
        let f = repo().join("configs").join(format!("{name}.toml"));
        let (code, out, err) = check(&f);
        assert_eq!(code, Some(0), "{name}: {out}{err}");
        assert!(out.contains(": ok: ") && out.contains("port(s)") && out.contains("socket "), "{name}: summary {out:?}");
        assert!(err.is_empty(), "{name}: stderr {err:?}");
    }
    let (code, out, _) = check(&repo().join("configs/loopback.toml"));
    assert_eq!(code, Some(0));
    assert!(out.contains("2 port(s) [pmrxe0, pmrxe1]") && out.contains("hugepages off"), "{out}");
}

#[test]
fn every_shipped_config_parses() {
    for e in std::fs::read_dir(repo().join("configs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let t = std::fs::read_to_string(&p).unwrap();
            if let Err(e) = pmrxe_config_parse(&t) {
                panic!("{}: {e}", p.display());
            }
        }
    }
}

/// Types and keys only (no machine checks): `pmrxe config check` on a copy with the
/// machine-dependent parts neutralised would be circular, so re-use the loader's syntax
/// checks through `config check` of a temp copy with hugepages off and lcores [1]/0.
fn pmrxe_config_parse(text: &str) -> Result<(), String> {
    let mut neutral = String::new();
    let mut section = String::new();
    for l in text.lines() {
        let t = l.trim_start();
        if t.starts_with('[') {
            section = t.trim_matches(|c| c == '[' || c == ']').to_string();
        }
        let key = t.split('=').next().unwrap_or("").trim();
        match (section.as_str(), key) {
            ("eal", "hugepages") => neutral.push_str("hugepages = false\n"),
            ("lcores", "cores") => neutral.push_str("cores = [1]\n"),
            ("lcores", "main_core") => neutral.push_str("main_core = 0\n"),
            _ => {
                neutral.push_str(l);
                neutral.push('\n');
            }
        }
    }
    let f = std::env::temp_dir().join(format!("pmrxe-cli-parse-{}.toml", std::process::id()));
    std::fs::write(&f, neutral).unwrap();
    let (code, out, err) = check(&f);
    let _ = std::fs::remove_file(&f);
    if code == Some(0) {
        Ok(())
    } else {
        Err(format!("{out}{err}"))
    }
}

/// A bad file: exit status 2, nothing on stdout, exactly one line on stderr that names the
/// field.
fn rejected(toml: &str, field: &str) {
    let f = std::env::temp_dir().join(format!("pmrxe-cli-bad-{}-{}.toml", std::process::id(), field.replace(['[', ']', '.'], "_")));
    std::fs::write(&f, toml).unwrap();
    let (code, out, err) = check(&f);
    let _ = std::fs::remove_file(&f);
    assert_eq!(code, Some(2), "{toml:?}: want exit 2; stdout {out:?} stderr {err:?}");
    assert!(out.is_empty(), "{toml:?}: stdout {out:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{toml:?}: want one line, got {err:?}");
    assert!(lines[0].contains(field), "{toml:?}: {:?} does not name {field:?}", lines[0]);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn config_check_rejects_bad_files_with_one_line_naming_the_field() {
    let lb = std::fs::read_to_string(repo().join("configs/loopback.toml")).unwrap();
    rejected("no_such_key = 1\n", "no_such_key");
    rejected(&lb.replace("[service]\n", "[service]\nsokcet = \"/tmp/x\"\n"), "sokcet");
    rejected(&lb.replacen("mac = \"02:00:c6:12:00:01\"", "mac = \"zz:00:c6:12:00:01\"", 1), "ports[0].mac");
    rejected(&lb.replacen("mac = \"02:00:c6:12:00:02\"", "mac = \"01:00:5e:00:00:01\"", 1), "ports[1].mac"); // multicast
    rejected("[[ports]]\nname = \"p\"\ndevargs = \"nosuchpmd0\"\n", "ports[0].devargs");
    rejected(&lb.replace("[service]\n", "[service]\nmetrics = \"localhost\"\n"), "service.metrics");
    rejected(&lb.replace("mtu = 9000", "mtu = 20000"), "mtu");
    let missing = std::env::temp_dir().join("pmrxe-cli-no-such-file.toml");
    let (code, _, err) = check(&missing);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn config_check_reports_the_metrics_endpoint() {
    let lb = std::fs::read_to_string(repo().join("configs/loopback.toml")).unwrap();
    let f = std::env::temp_dir().join(format!("pmrxe-cli-metrics-{}.toml", std::process::id()));
    std::fs::write(&f, lb.replace("[service]\n", "[service]\nmetrics = \"127.0.0.1:9771\"\n")).unwrap();
    let (code, out, err) = check(&f);
    let _ = std::fs::remove_file(&f);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("metrics http://127.0.0.1:9771/metrics"), "{out}");
}

#[test]
fn config_default_is_the_shipped_loopback() {
    let o = pmrxe(&["config", "default"]);
    assert!(o.status.success());
    assert_eq!(text(&o).0, std::fs::read_to_string(repo().join("configs/loopback.toml")).unwrap());
}
