# Sourced by the step scripts (miri.sh, fuzz.sh, rdma-core-tests.sh, ...): what a step does when
# it cannot run. CI must not pass by skipping, so a step that cannot run FAILS with a message
# saying why and how to fix it, unless PMRXE_CI_ALLOW_SKIP (a comma-separated list of step
# names, or "all") names the step; then it prints "SKIPPED" with the reason, records the skip in
# $PMRXE_CI_REPORT (set by scripts/test.sh, which lists every skip at the end) and exits 0.
#
#   ci_cannot_run STEP "reason" "fix"     # never returns
#   ci_skip_allowed STEP                  # status 0 if PMRXE_CI_ALLOW_SKIP names STEP

ci_skip_allowed() {
  local s
  IFS=, read -ra _ci_allowed <<< "${PMRXE_CI_ALLOW_SKIP:-}"
  for s in "${_ci_allowed[@]}"; do
    s=${s// /}
    [ "$s" = "$1" ] || [ "$s" = all ] && return 0
  done
  return 1
}

ci_cannot_run() {
  local step=$1 reason=$2 fix=${3:-}
  if ci_skip_allowed "$step"; then
    echo "$step: SKIPPED (allowed by PMRXE_CI_ALLOW_SKIP=${PMRXE_CI_ALLOW_SKIP}): $reason"
    [ -n "${PMRXE_CI_REPORT:-}" ] && printf 'skipped\t%s\t%s\n' "$step" "$reason" >> "$PMRXE_CI_REPORT"
    exit 0
  fi
  echo "$step: FAILED: cannot run: $reason" >&2
  [ -n "$fix" ] && echo "$step: fix: $fix" >&2
  echo "$step: (to skip this step on purpose, set PMRXE_CI_ALLOW_SKIP=$step)" >&2
  exit 1
}
