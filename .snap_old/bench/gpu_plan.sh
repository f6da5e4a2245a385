#!/usr/bin/env bash
# One device call: install (project + the upstream wheels carried in .whl/), then run a plan's lines in order, each
# time-boxed, within $DEADLINE seconds (default 575: the device tool's calls end at 600 s), then regenerate
# BENCHMARKS.md and pack bench/results into $OUT.
#
#   bash bench/gpu_plan.sh bench/plans/fish.txt            (make gpu-wheels first; carry .whl)
#
# Plan lines: "SECONDS|command"; $R = `python3 -m bench run` with the common options below (one stage process per
# stage, results merged into the committed JSON with --merge), $VL = `python3 -m bench voxcpm-loop`, $T = pytest
# on tests/gpu; BUDGET is replaced by the line's seconds minus 10. Lines that no longer fit are reported, not run.
# "!SECONDS|command" is a gate: if it fails, the rest of the plan is skipped (no device time spent on a broken setup).
set -u
cd "$(dirname "$0")/.."
# Always /usr/bin/g++ there (a preset $CXX wrapper builds packages that segfault on load: seen 2026-11-21, every
# build of that call failed its load check); TTSAOT_CXX overrides it deliberately.
export CXX=${TTSAOT_CXX:-/usr/bin/g++} PYTHONUNBUFFERED=1
T0=$(date +%s); PLAN=$1; DEADLINE=${DEADLINE:-575}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .whl/*.whl >> "$OUT/install.txt" 2>&1
echo "installed at $(( $(date +%s) - T0 )) s; CXX=$CXX ($($CXX --version | head -1)); g++ on PATH: $(command -v g++)"
CACHE=${BENCH_CACHE:-/tmp/benchcache}
COMMON="--out bench/results --cache-dir $CACHE --no-snake --record-failures --no-coldstart --merge --stream-variants none --throughput-variants none"
R="python3 -m bench run $COMMON"
VL="python3 -m bench voxcpm-loop --cache-dir $CACHE --out bench/results"
T="python3 -m pytest -v -p no:cacheprovider -m gpu"
i=0
while IFS='|' read -r secs cmd; do
  case "$secs" in ''|\#*) continue ;; esac
  gate=0; case "$secs" in !*) gate=1; secs=${secs#!} ;; esac
  i=$((i + 1))
  L=$(( DEADLINE - 25 - ($(date +%s) - T0) ))
  S=$(( secs < L ? secs : L ))
  [ "$S" -lt 30 ] && { echo "no time left for: $cmd"; continue; }
  cmd=$(eval echo "\"$cmd\""); cmd=${cmd//BUDGET/$((S - 10))}
  echo "@$(( $(date +%s) - T0 ))s [$S s] $cmd" | cut -c1-220
  # SIGINT first: pytest prints its summary, bench run records what it measured
  timeout -s INT -k 15 "$S" bash -c "$cmd" > "$OUT/step$i.log" 2>&1; rc=$?; echo "  rc $rc"
  grep -hE "^\s*\[bench\]|passed|failed" "$OUT/step$i.log" | cut -c1-200 | tail -8
  [ "$gate" = 1 ] && [ "$rc" != 0 ] && { echo "gate failed: the rest of the plan is not run"; tail -5 "$OUT/step$i.log"; break; }
done < "$PLAN"
python3 -m bench report > "$OUT/report.log" 2>&1
tar czf "$OUT/bench_results.tar.gz" bench/results BENCHMARKS.md
echo "done at $(( $(date +%s) - T0 )) s; unpack here: tar xzf <files_at>/bench_results.tar.gz"
