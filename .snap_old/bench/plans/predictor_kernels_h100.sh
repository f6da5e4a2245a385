#!/usr/bin/env bash
# One device call (issue 14): the codebook predictors (Fish fast_ar, Qwen code_predictor) on the ttsaot kernel layer
# (`--kernels ttsaot`, opt-in) against their default build (auto = Inductor's code), full presets, bf16. Per stage,
# in turn: both kernel choices built side by side with the builder's verification (golden codes through the runtime
# on the GPU), each profiled, then (RUN=1) both timed in one `bench run` process beside the torch.compile per-step
# loop in CUDA graphs (vLLM-Omni). $OUT: the profile JSONs, the run JSONs, the logs and tables in one tarball.
#   STAGES="fish-s2-pro/fast_ar qwen3-tts-12hz/code_predictor" AXIS=batch=1 RUN=0 bash bench/plans/predictor_kernels_h100.sh
#   (code_predictor, whose auto is the kernel layer: KERNELS=ttsaot,inductor VARIANTS=ttsaot_kernels,ttsaot_inductor,loop_compile_graph)
# (2026-11-25, H100: both stages at batch 1,8 with RUN=1 did not fit one call: the two fast_ar builds took 215-239 s
# side by side with code_predictor's, which had not finished at 300 s; fast_ar alone at batch 1 with RUN=1: 530 s.)
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS" "$OUT/profiles"; T0=$(date +%s)
AXIS=${AXIS:-batch=1}; BUILD_S=${BUILD_S:-240}; COMPILE_S=${COMPILE_S:-120}; RUN=${RUN:-1}; CACHE=/tmp/pk_cache
STAGES=${STAGES:-fish-s2-pro/fast_ar}; END_S=${END_S:-570}
# the kernel choices built and profiled, and the run's variants (the code_predictor's auto is the kernel layer)
KERNELS=${KERNELS:-auto,ttsaot}; PROFILE=${PROFILE-ttsaot inductor}  # PROFILE="" profiles none
VARIANTS=${VARIANTS:-ttsaot_graph,ttsaot_kernels,loop_compile_graph}
left() { echo $(( END_S - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
for st in $STAGES; do
  s=${st//\//_}; L=$(left); [ "$L" -gt 60 ] || { echo "skipped $st (time)"; continue; }
  timeout -s INT -k 10 $(( L < BUILD_S ? L : BUILD_S )) python3 -m bench build "$st" --axis "$AXIS" \
    --kernels "$KERNELS" --jobs 8 --cache-dir "$CACHE" > "$LOGS/build_$s.log" 2>&1
  echo "$st built at $(( $(date +%s) - T0 )) s:"; grep -h "bench build" "$LOGS/build_$s.log" | cut -c1-240
  for k in $PROFILE; do
    L=$(left); [ "$L" -gt 20 ] || { echo "skipped profile $st $k (time)"; continue; }
    timeout -s INT -k 10 "$L" python3 -m bench profile "$st" --axis "$AXIS" --kernels "$k" --cache-dir "$CACHE" \
      --out "$OUT/profiles" --calls 10 --reps 50 > "$LOGS/profile_${k}_$s.log" 2>&1
    echo "$k $st:"; grep -E '^\[b' "$LOGS/profile_${k}_$s.log" | cut -c1-220
  done
  [ "$RUN" = 1 ] || continue
  L=$(left); [ "$L" -gt 40 ] || { echo "skipped run $st (time)"; continue; }
  timeout -s INT -k 10 "$L" python3 -m bench run --device cuda --family "${st%%/*}" --stages "${st##*/}" --axis "$AXIS" \
    --variants "$VARIANTS" --compile-budget "$COMPILE_S" --compile-mode "${COMPILE_MODE:-max-autotune-no-cudagraphs}" --no-coldstart \
    --no-snake --throughput-batches 1 --time-budget $(( L - 20 )) --stage-timeout $(( L - 25 )) --cache-dir "$CACHE" \
    --out "$OUT/run" > "$LOGS/run_$s.log" 2>&1
  grep -E "ttsaot|loop_|skipped|rror" "$LOGS/run_$s.log" | tail -12 | cut -c1-240
done
cp "$CACHE"/logs/*.log "$LOGS"/ 2>/dev/null  # the stage processes' own logs
[ -d "$OUT/run" ] && find "$OUT/run" -name '*.json' -exec mv {} "$OUT"/ \; ; rm -rf "$OUT/run"
mv "$OUT/profiles"/*.txt "$LOGS"/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
