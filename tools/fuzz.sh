#!/usr/bin/env bash
# `make fuzz`: tests/test_fuzz.py with fresh seeds for FUZZ_SECONDS (default an
# hour), one pytest process per round (hypothesis profile "fuzz", 100 examples),
# so each round starts from a clean heap. Prints every failing round's seed and
# the command that replays it; exits 1 if any round failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_BUDGET="${FUZZ_SECONDS:-3600}"
LOG_DIR="${FUZZ_LOG_DIR:-out/fuzz}"
mkdir -p "$LOG_DIR"
COUNT="$LOG_DIR/examples.txt"
: > "$COUNT"
start=$(date +%s)
rounds=0
failed=()
while (( $(date +%s) - start < SECONDS_BUDGET )); do
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  rounds=$((rounds + 1))
  if ! COARSE_HYPOTHESIS_PROFILE=fuzz COARSE_FUZZ_LOG="$COUNT" \
      .venv/bin/pytest -q -p no:cacheprovider tests/test_fuzz.py --hypothesis-seed="$seed" \
      > "$LOG_DIR/round_$seed.log" 2>&1; then
    failed+=("$seed")
    echo "round $rounds FAILED, seed $seed (log: $LOG_DIR/round_$seed.log); replay:"
    echo "  COARSE_HYPOTHESIS_PROFILE=fuzz .venv/bin/pytest tests/test_fuzz.py --hypothesis-seed=$seed"
  else
    rm -f "$LOG_DIR/round_$seed.log"
  fi
done
echo "fuzz: $rounds rounds, $(wc -l < "$COUNT") examples, ${#failed[@]} failed rounds" \
  "in $(( $(date +%s) - start )) s${failed:+ (seeds: ${failed[*]})}"
(( ${#failed[@]} == 0 ))
