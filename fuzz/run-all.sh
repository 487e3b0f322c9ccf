#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 10) from its committed seeds
# (fuzz/seeds/<target>/, read only) and a scratch corpus
# (fuzz/corpus/<target>/, git-ignored, where libFuzzer keeps what it finds).
# A crash stops the run and leaves its input in fuzz/artifacts/<target>/.
# Prints each target's last libFuzzer status line (executions, cov, ft).
# Needs the nightly toolchain and cargo-fuzz (.ci/run installs both).
#
# With VOLUMED_FUZZ_RUNS=N (as CI sets it) each target instead runs exactly
# N inputs with a fixed seed, from the committed seeds alone (the scratch
# corpus is not read): a commit then fuzzes much the same inputs on every
# run (libFuzzer's counts still differ by a few between runs, not its path),
# where the timed mode from a growing corpus fuzzed different ones each
# time. The timed mode is for finding new inputs by hand.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-10}
runs=${VOLUMED_FUZZ_RUNS:-}
export CARGO_TARGET_DIR="$PWD/target"
cargo +nightly fuzz build
mkdir -p logs
for t in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$t"
  if [ -n "$runs" ]; then
    # a fresh scratch dir: what earlier runs found must not change this one
    rm -rf "corpus/$t.ci" && mkdir -p "corpus/$t.ci"
    set -- "corpus/$t.ci" "seeds/$t" -- -runs="$runs" -seed=1
  else
    set -- "corpus/$t" "seeds/$t" -- -max_total_time="$secs"
  fi
  if ! cargo +nightly fuzz run "$t" "$@" -rss_limit_mb=2048 -print_final_stats=1 \
      >"logs/$t.log" 2>&1; then
    echo "fuzz target $t FAILED; its log (fuzz/logs/$t.log) ends:"
    tail -40 "logs/$t.log"
    exit 1
  fi
  last=$(grep -E '^#[0-9]+' "logs/$t.log" | tail -1)
  echo "$t: $last"
done
