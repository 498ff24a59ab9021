#!/usr/bin/python3
"""Run rdma-core's own pyverbs test suite against pmrxe, one process per test.

The suite (rdma-core's tests/ directory, unmodified) is copied into a scratch directory (it
writes .pyc files) and run through `pmrxe run --` with Debian's python3-pyverbs. Each test gets
its own process and a timeout, so a crash or a hang is attributed to one test and the run goes
on. Prints one line per test (ok / FAIL / ERROR / skip / CRASH / TIMEOUT) and a summary; exits
non-zero when any test did not pass or skip.

Usage: rdma-core-tests.py DIR [--pmrxe BIN] [--dev pmrxe0] [--gid 1] [--timeout S]
                              [--single] [--jobs-filter SUBSTR ...] [--skips-detail]
DIR holds rdma-core's tests/ (scripts/rdma-core-tests.sh prepares it from Debian's rdma-core
package and checks it is v44's). A service must be reachable (PMRXE_SOCKET);
scripts/rdma-core-tests.sh starts a private one.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RESULT_RE = re.compile(r"^(test\S+) \((\S+)\)(?:\s*\n?.*?)? \.\.\. (.*)$")


def run(cmd, timeout, cwd):
    """Run cmd; returns (returncode or None on timeout, output)."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out.decode(errors="replace")


def classify(rc, out):
    """One test's outcome from unittest's verbose output and the exit status."""
    if rc is None:
        return "TIMEOUT", ""
    if rc < 0:
        return "CRASH", "signal %d" % -rc
    tail = out.strip().splitlines()
    summary = "\n".join(tail[-4:])
    m = re.search(r"\.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)\s*$", out, re.M)
    if "OK (skipped=" in summary or (m and m.group(1).startswith("skipped")):
        reason = m.group(1)[len("skipped"):].strip(" '\"") if m else ""
        return "skip", reason
    if rc == 0 and re.search(r"^OK\b", summary, re.M):
        return "ok", ""
    # The first line of the traceback's exception names the cause.
    err = ""
    for line in reversed(tail):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Failure)\b", line) or line.startswith("AssertionError"):
            err = line.strip()
            break
    if "FAILED (failures=" in summary:
        return "FAIL", err
    if "FAILED (errors=" in summary:
        return "ERROR", err
    return "ERROR", err or "exit %d" % rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--pmrxe", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "pmrxe"))
    ap.add_argument("--dev", default="pmrxe0")
    ap.add_argument("--gid", default="1")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--single", action="store_true", help="also run the whole suite in one process")
    ap.add_argument("--only", nargs="*", default=[], help="run tests whose id contains one of these")
    args = ap.parse_args()

    src = os.path.join(args.dir, "tests")
    if not os.path.isfile(os.path.join(src, "run_tests.py")):
        print("rdma-core-tests: %s has no tests/run_tests.py" % args.dir, file=sys.stderr)
        return 2
    pmrxe = os.path.abspath(args.pmrxe)
    scratch = tempfile.mkdtemp(prefix="pmrxe-rdma-core-tests.")
    try:
        shutil.copytree(src, os.path.join(scratch, "tests"))
        base = [pmrxe, "run", "--", "/usr/bin/python3", "-B", "tests/run_tests.py",
                "--dev", args.dev, "--gid", args.gid]
        rc, out = run(base + ["--list-tests"], 120, scratch)
        ids = [l.strip() for l in out.splitlines() if l.startswith("tests.")]
        if rc != 0 or not ids:
            print("rdma-core-tests: could not list the tests (exit %s):\n%s" % (rc, out), file=sys.stderr)
            return 1
        if args.only:
            ids = [t for t in ids if any(s in t for s in args.only)]
        counts = {}
        bad = []
        start = time.time()
        for t in ids:
            rc, out = run(base + ["-v", t], args.timeout, scratch)
            kind, why = classify(rc, out)
            counts[kind] = counts.get(kind, 0) + 1
            print("%-8s %s%s" % (kind, t, ("  -- " + why) if why else ""), flush=True)
            if kind not in ("ok", "skip"):
                bad.append((t, kind, out))
        print("\nrdma-core-tests: %d tests in %.0f s: %s" % (
            len(ids), time.time() - start,
            ", ".join("%s %d" % (k, counts.get(k, 0)) for k in ("ok", "skip", "FAIL", "ERROR", "CRASH", "TIMEOUT"))))
        for t, kind, out in bad:
            print("\n==== %s %s\n%s" % (kind, t, "\n".join(out.splitlines()[-40:])))
        status = 1 if bad else 0
        if args.single:
            sel = [t for t in ids] if args.only else []
            rc, out = run(base + ["-v"] + sel, max(args.timeout * 10, 900), scratch)
            last = "\n".join(out.strip().splitlines()[-3:])
            ok = rc == 0
            print("\nrdma-core-tests: whole suite in one process: %s (exit %s)\n%s" % (
                "ok" if ok else "FAILED", rc, last))
            if not ok:
                print("\n".join(l for l in out.splitlines() if re.search(r"\.\.\. (FAIL|ERROR)", l)))
                status = 1
        return status
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
