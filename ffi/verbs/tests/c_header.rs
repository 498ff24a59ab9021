//! `include/pmrxedv.h` and the fastreg example compile cleanly against the system verbs.h and
//! link against the shim (no service needed).
use std::path::Path;
use std::process::Command;

#[test]
fn pmrxedv_header_and_example_compile_and_link() {
    let cc = Command::new("cc").arg("--version").output();
    assert!(cc.is_ok_and(|o| o.status.success()), "no C compiler `cc`: Debian package gcc (scripts/setup.sh installs it)");
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = std::env::current_exe().unwrap();
    let libdir = exe.parent().unwrap().parent().unwrap();
    assert!(libdir.join("libpmrxe_verbs.so").exists());
    let out = std::env::temp_dir().join(format!("pmrxe-fastreg-{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(ws.join("ffi/verbs/include"))
        .arg("-o")
        .arg(&out)
        .arg(ws.join("examples/pmrxedv/fastreg.c"))
        .arg(format!("-L{}", libdir.display()))
        .arg("-lpmrxe_verbs")
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(st.success());
}
