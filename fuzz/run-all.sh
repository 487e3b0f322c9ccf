#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 10) from its committed seeds
# (fuzz/seeds/<target>/, read only) and a scratch corpus
# (fuzz/corpus/<target>/, git-ignored, where libFuzzer keeps what it finds).
# A crash stops the run and leaves its input in fuzz/artifacts/<target>/.
# Prints each target's last libFuzzer status line (executions, cov, ft).
# Needs the nightly toolchain and cargo-fuzz (.ci/run installs both).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-10}
export CARGO_TARGET_DIR="$PWD/target"
cargo +nightly fuzz build
mkdir -p logs
for t in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$t"
  if ! cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
      >"logs/$t.log" 2>&1; then
    echo "fuzz target $t FAILED; its log (fuzz/logs/$t.log) ends:"
    tail -40 "logs/$t.log"
    exit 1
  fi
  last=$(grep -E '^#[0-9]+' "logs/$t.log" | tail -1)
  echo "$t: $last"
done
