#!/usr/bin/env bash
# `make fuzz`: tests/test_fuzz.py with fresh seeds for FUZZ_SECONDS (default an
# hour), one pytest process per round (hypothesis profile "fuzz", 100 examples),
# so each round starts from a clean heap. Rounds take turns over FUZZ_BACKENDS
# (default "cpu streams"): the plain CPU backend, and the stream-semantics
# backend (COARSE_JAX_BACKEND=streams) with chaos on, seeded by the round's seed
# (COARSE_JAX_STREAM_CHAOS). Prints every failing round's seed, backend and the
# command that replays it; exits 1 if any round failed.
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
read -r -a BACKENDS <<< "${FUZZ_BACKENDS:-cpu streams}"
declare -A per_backend
while (( $(date +%s) - start < SECONDS_BUDGET )); do
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  backend=${BACKENDS[$((rounds % ${#BACKENDS[@]}))]}
  rounds=$((rounds + 1))
  per_backend[$backend]=$(( ${per_backend[$backend]:-0} + 1 ))
  env=(COARSE_JAX_BACKEND="$backend")
  [[ "$backend" == streams ]] && env+=(COARSE_JAX_STREAM_CHAOS="$seed")
  if ! env "${env[@]}" COARSE_HYPOTHESIS_PROFILE=fuzz COARSE_FUZZ_LOG="$COUNT" \
      .venv/bin/pytest -q -p no:cacheprovider tests/test_fuzz.py --hypothesis-seed="$seed" \
      > "$LOG_DIR/round_$seed.log" 2>&1; then
    failed+=("$seed/$backend")
    echo "round $rounds FAILED, seed $seed, backend $backend (log: $LOG_DIR/round_$seed.log); replay:"
    echo "  ${env[*]} COARSE_HYPOTHESIS_PROFILE=fuzz .venv/bin/pytest tests/test_fuzz.py" \
      "--hypothesis-seed=$seed"
  else
    rm -f "$LOG_DIR/round_$seed.log"
  fi
done
summary=""
for b in "${!per_backend[@]}"; do summary+=" $b: ${per_backend[$b]}"; done
echo "fuzz: $rounds rounds (${summary# }), $(wc -l < "$COUNT") examples," \
  "${#failed[@]} failed rounds in $(( $(date +%s) - start )) s${failed:+ (seeds: ${failed[*]})}"
(( ${#failed[@]} == 0 ))
