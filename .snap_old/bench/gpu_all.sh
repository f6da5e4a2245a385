#!/usr/bin/env bash
# One call on the GPU machine (repo root, no network): install, measure every selected stage within a time
# budget (one subprocess per stage: a crash or OOM costs that stage only), write BENCHMARKS.md, pack the
# results into $OUT and print a summary.
#
#   bash bench/gpu_all.sh
#
# Environment (all optional):
#   BENCH_TIME_BUDGET   seconds for all measurements (default 480; the whole script stays under ~9.5 min)
#   BENCH_FAMILIES      comma-separated families (default qwen3-tts-12hz; "all" = every registered family)
#   BENCH_STAGES        comma-separated stage names (default code2wav; "all" = every stage of the families)
#   BENCH_ARGS          extra arguments for `python -m bench run` (e.g. "--variants eager,ttsaot_graph")
#   BENCH_GIT_COMMIT    commit recorded in the JSON (the GPU copy of the tree has no .git)
#   BENCH_SKIP_INSTALL  set to skip `pip install -e .` (already installed)
#   OUT                 where the files to bring back go (the device tool sets it)
#
# One full-size stage with every variant, its build and both cold starts takes ~5-8 min on an H100, so one call
# measures one or two stages; e.g. a second call:
#   BENCH_FAMILIES=fish-s2-pro BENCH_STAGES=dac_decoder,fast_ar BENCH_ARGS="--compile-budget 90" \
#       bash bench/gpu_all.sh
# Each call returns its own bench_results.tar.gz; unpack them all here and run `python -m bench report`.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
export CXX=/usr/bin/g++
export PYTHONUNBUFFERED=1
OUT=${OUT:-$REPO/out}
mkdir -p "$OUT"
LOG=$OUT/bench_log.txt
: >"$LOG"
BUDGET=${BENCH_TIME_BUDGET:-480}
T0=$(date +%s)

echo "== install (editable, no deps, no network)" | tee -a "$LOG"
if [ -z "${BENCH_SKIP_INSTALL:-}" ]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 \
        || echo "pip install -e . failed" | tee -a "$LOG"
fi
if ! python3 -c "import ttsaot.builder, ttsaot.runtime" >>"$LOG" 2>&1; then
    # Fallback: a namespace-package shim mapping ttsaot.builder / ttsaot.runtime onto the repo folders.
    SHIM=$(mktemp -d)
    mkdir -p "$SHIM/ttsaot"
    ln -s "$REPO/builder" "$SHIM/ttsaot/builder"
    ln -s "$REPO/runtime" "$SHIM/ttsaot/runtime"
    export PYTHONPATH="$SHIM:${PYTHONPATH:-}"
    echo "using import shim $SHIM" | tee -a "$LOG"
fi
python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
try:
    import triton
    print("triton", triton.__version__)
except Exception as e:
    print("triton unavailable:", e)
import importlib.util
for mod in ("matplotlib", "transformers", "qwen_tts"):   # qwen_tts: installed is enough (imported module-alone)
    print(mod, "installed" if importlib.util.find_spec(mod) else "NOT installed")
EOF

FAMILIES=${BENCH_FAMILIES:-qwen3-tts-12hz}
STAGES=${BENCH_STAGES:-code2wav}
# Variants cheapest first; upstream_compile is left out by default (add it with BENCH_ARGS="--variants ...").
ARGS=(--out bench/results --time-budget "$BUDGET" --stage-timeout "$BUDGET" --compile-budget 120
      --coldstart-budget 120 --coldstart-compile-mode default --record-failures
      --variants eager_raw,eager,eager_graph,ttsaot_nograph,ttsaot_graph,ttsaot_inductor,upstream_eager,compile_graph,compile_ro)
[ "$FAMILIES" != all ] && ARGS+=(--family "$FAMILIES")
[ "$STAGES" != all ] && ARGS+=(--stages "$STAGES")
# shellcheck disable=SC2206
[ -n "${BENCH_ARGS:-}" ] && ARGS+=($BENCH_ARGS)

echo "== bench (budget ${BUDGET}s): python3 -m bench run ${ARGS[*]}" | tee -a "$LOG"
timeout -k 10 $((BUDGET + 30)) python3 -m bench run "${ARGS[@]}" 2>&1 | tee -a "$LOG"
echo "bench exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
sed -n '/== bench summary/,$p' "$LOG" >"$OUT/summary.txt"

echo "== report" | tee -a "$LOG"
python3 -m bench report 2>&1 | tee -a "$LOG"
cp BENCHMARKS.md "$OUT/BENCHMARKS.md" 2>/dev/null
tar czf "$OUT/bench_results.tar.gz" bench/results BENCHMARKS.md 2>>"$LOG"
# full worker output per stage (tracebacks, compile logs): for debugging, never committed
[ -d bench/.cache/logs ] && tar czf "$OUT/bench_worker_logs.tar.gz" -C bench/.cache logs 2>>"$LOG"

echo "== done in $(( $(date +%s) - T0 )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
echo "unpack here with: tar xzf <files_at>/bench_results.tar.gz  (then: python -m bench report)"
