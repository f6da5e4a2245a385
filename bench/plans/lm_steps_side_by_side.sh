#!/usr/bin/env bash
# One device call (issue 14): the VoxCPM2 LM decode steps side by side at this tree, in `bench run`'s one process
# per stage: eager, upstream eager, torch.compile (max-autotune-no-cudagraphs) + manual CUDA graph, and the
# artifact on its CUDA default (the kernel layer), each against the byte floor. The committed per-stage JSONs of
# these stages predate the kernel layer (2026-11-21); this replaces them (no --merge: one commit per file).
# 1. `bench build` of STAGES at BATCHES (verified) while the GPU tests of TESTS run beside them;
# 2. per stage, `bench run` with VARIANTS (COMPILE_S per torch.compile variant, its compile time recorded); the
#    ttsaot_graph cell also records the call without its input checks and with them eager;
# 3. each run's own summary; the JSONs in $OUT/results/<device>/ (to copy into bench/results/ before `bench report`).
#   BENCH_GIT_COMMIT=<this tree's commit, spelled out> bash bench/plans/lm_steps_side_by_side.sh  (carry .whl:
#   `make gpu-wheels` first, for upstream_eager)
#   STAGES=base_lm_step VARIANTS=compile_graph BATCHES=1 COMPILE_S=520 MERGE=nvidia-h100 BUILD_S=0 TESTS= ...: a
#   second call for what the first could not fit, merged into the JSON committed under bench/results/$MERGE/
#   (entries marked merged_from); BUILD_S=0 skips the build (the torch.compile variant needs no artifact)
. "$(dirname "$0")/setup_device.sh"
END_S=${END_S:-570}
STAGES=${STAGES:-residual_lm_step base_lm_step}
BATCHES=${BATCHES:-1,16}
VARIANTS=${VARIANTS:-eager,ttsaot_graph,upstream_eager,compile_graph}
L=tests/gpu/test_gpu_voxcpm2_lm.py
TESTS=${TESTS-tests/test_runtime_core.py $L::test_a_nan_row_input_leaves_the_live_cache_and_positions_untouched}
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .whl/*.whl >> "$LOGS/install.txt" 2>&1
CACHE=/tmp/side_cache
# results and logs go straight under $OUT, so a call cut short still returns what it measured
RES=$OUT/results; mkdir -p "$RES"
if [ -n "${MERGE:-}" ]; then  # the committed files a merge adds to, where `bench run` writes: the device's slug
  SLUG=$(python3 -c "import torch; from bench.common import device_info; print(device_info(torch.device('cuda'))['slug'])")
  mkdir -p "$RES/$SLUG"; cp "bench/results/$MERGE"/voxcpm2__*_lm_step.json "$RES/$SLUG"/
fi
BUILD=$(for s in $STAGES; do printf 'voxcpm2/%s ' "$s"; done)
[ "${BUILD_S:-200}" = 0 ] || timeout -s INT -k 10 "${BUILD_S:-200}" python3 -m bench build $BUILD \
  --axis "batch=$BATCHES" --jobs 2 --cache-dir "$CACHE" > "$LOGS/build.log" 2>&1 &
[ -n "$TESTS" ] && timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -v -n "${TEST_WORKERS:-3}" -p no:cacheprovider \
  $TESTS > "$LOGS/gpu_tests.txt" 2>&1 &
wait
echo "builds and tests done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS/build.log" | cut -c1-200
if [ -n "$TESTS" ]; then
  echo "gpu tests: $(grep -cE ' PASSED' "$LOGS/gpu_tests.txt") passed, $(grep -cE ' FAILED| ERROR' "$LOGS/gpu_tests.txt") failed"
  grep -E "FAILED|ERROR" "$LOGS/gpu_tests.txt" | head -20 | cut -c1-300
fi
N=$(echo $STAGES | wc -w); i=0
for st in $STAGES; do
  i=$((i + 1))
  # what is left, shared out among the stages still to run; the stage timeout inside this box and the compile budget
  # inside that, so each stage ends on its own terms (an H100 call at a816fdd lost both stages' JSONs when the box's
  # SIGINT arrived first; bench run now writes what a stage measured when interrupted, too)
  LEFT=$(( (END_S - 25 - ($(date +%s) - T0)) / (N - i + 1) )); [ "$LEFT" -gt 60 ] || { echo "skipped $st (time)"; continue; }
  C=$(( ${COMPILE_S:-170} < LEFT - 60 ? ${COMPILE_S:-170} : LEFT - 60 ))
  timeout -s INT -k 10 "$LEFT" python3 -m bench run --family voxcpm2 --stages "$st" --axis "batch=$BATCHES" \
    --variants "$VARIANTS" --compile-budget "$C" --no-coldstart --no-snake --stream-variants none \
    --throughput-variants none --stage-timeout $(( LEFT - 30 )) --cache-dir "$CACHE" --record-failures \
    ${MERGE:+--merge} --out "$RES" > "$LOGS/run_$st.log" 2>&1
  echo "run $st rc $? at $(( $(date +%s) - T0 )) s (compile budget $C s)"
  grep "\[bench\]" "$LOGS/run_$st.log" | cut -c1-240 | tail -12; sed -n '/== bench summary/,$p' "$LOGS/run_$st.log" | cut -c1-240
done
echo "done at $(( $(date +%s) - T0 )) s; copy $OUT/results/<device>/*.json into bench/results/<device>/ and run bench report"
