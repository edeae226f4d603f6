#!/usr/bin/env bash
# Gate a checkpoint from CI with nothing but the `crucible` CLI and an API token (README, "Gate a checkpoint in CI").
#
#   CRUCIBLE_URL=https://crucible.example CRUCIBLE_TOKEN=crk_... tests/scripts/gate_check.sh GATE CHECKPOINT [SUMMARY]
#
# Exits as `crucible gate check` does: 0 the gate passes, 1 a rule failed (or, unless GATE_PENDING_OK=1, an approver
# has not approved yet), 2 the check could not run. SUMMARY (default gate-summary.md) gets the Markdown for a
# pull-request comment.
set -uo pipefail
gate=${1:?usage: gate_check.sh GATE CHECKPOINT [SUMMARY]}
checkpoint=${2:?usage: gate_check.sh GATE CHECKPOINT [SUMMARY]}
summary=${3:-gate-summary.md}

pending=()
[ "${GATE_PENDING_OK:-0}" = 1 ] && pending=(--pending-ok)
crucible gate check --gate "$gate" --checkpoint "$checkpoint" --markdown "$summary" --poll 2 \
  --timeout "${GATE_TIMEOUT:-1800}" "${pending[@]}"
code=$?
case $code in
  0) echo "gate $gate: checkpoint $checkpoint passes (see $summary)" ;;
  1) echo "gate $gate: checkpoint $checkpoint FAILS (see $summary)" ;;
  *) echo "gate $gate: the check could not run (exit $code)" ;;
esac
exit $code
