#!/usr/bin/env bash
# Runs the Python package's acceptance scripts one after another, every one of them whatever the
# others did, and reports each one's exit code; exits non-zero if any failed. With OUT set, the
# whole output also goes to $OUT/python-checks.log. Arguments go to every script
# (e.g. --cpu-smoke, --seed N). PYTHON picks the interpreter (default: python3).
#
#   bench/python/run_all.sh                 # on the GPU machine, with the wheel installed (~2 min on an H200)
#   OUT=/tmp/out bench/python/run_all.sh --cpu-smoke
set -uo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  log="$OUT/python-checks.log"
  : >"$log"
fi
scripts=(zero_copy_order gil resume memory train_gpt)
codes=()
failed=0
for s in "${scripts[@]}"; do
  echo "=== $s.py $* ($(date -u +%FT%TZ))" | tee -a "$log"
  start=$SECONDS
  "$py" "$s.py" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  echo "=== $s.py exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  codes+=("$s=$rc")
  [ "$rc" -eq 0 ] || failed=1
done
echo "=== exit codes: ${codes[*]}" | tee -a "$log"
if [ "$failed" -ne 0 ]; then
  echo "=== FAIL" | tee -a "$log"
  exit 1
fi
echo "=== PASS" | tee -a "$log"
