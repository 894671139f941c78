#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) in build-fuzz/ and runs each one for
# FUZZ_SECONDS (default 300: `make fuzz`; `make fuzz-smoke` passes 5). Usage: scripts/fuzz.sh [TARGET...]
# (names without the fuzz_ prefix; default all). New inputs go to build-fuzz/corpus/<target>/ (the seeds in
# fuzz/corpus/<target>/ are read, never written); a finding is saved as fuzz/crashes/<target>/crash-* (or
# leak-*, timeout-*, oom-*) and fails the script. Reproduce one with: build-fuzz/fuzz_<target> FILE
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_EACH=${FUZZ_SECONDS:-300}
# FUZZ_RUNS=N: a fixed number of inputs from a fixed seed instead of a time budget, so that `make test`
# sees the same inputs on every machine (a time budget would test more or fewer depending on the load).
RUNS=${FUZZ_RUNS:-}
JOBS=${JOBS:-$(nproc)}
BUILD=${FUZZ_BUILD:-build-fuzz}
command -v clang++ >/dev/null || { echo "clang++ not found (Debian: clang libclang-rt-14-dev)" >&2; exit 1; }
if [ ! -f "$BUILD/Makefile" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CXX=clang++ cmake -S fuzz -B "$BUILD" "${launcher[@]}" >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS" >/dev/null
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors model_config tokenizer train_config chat_jsonl shard_manifest megatron_index rescore chat_format openai_request task_files)
status=0
for t in "${targets[@]}"; do
  mkdir -p "$BUILD/corpus/$t" "fuzz/crashes/$t"
  log="$BUILD/fuzz_$t.log"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: LibTorch's targets start near 550 MB.
  budget=(-max_total_time="$SECONDS_EACH")
  [ -n "$RUNS" ] && budget=(-runs="$RUNS" -seed=1)
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$BUILD/fuzz_$t" "${budget[@]}" -timeout=10 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="fuzz/crashes/$t/" \
      "$BUILD/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz_$t: ok, $runs runs ($speed/s), $cov"
  else
    echo "fuzz_$t: FINDING (log: $log; input: fuzz/crashes/$t/)" >&2
    grep -m3 -E 'ERROR|runtime error|terminate called|what\(\)|deadly signal|Timeout' "$log" >&2 || tail -20 "$log" >&2
    status=1
  fi
done
exit $status
