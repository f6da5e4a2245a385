#!/usr/bin/env bash
# One device call: both VoxCPM2 decode steps (base_lm_step with 8 of its 28 layers, residual_lm_step with all 8) built
# --kernels ttsaot and --kernels inductor, checked, timed (eager, eager + graph, torch.compile + graph, floor) and
# profiled, in < 10 minutes on an H100:   bash bench/plans/decode_steps_h100.sh
#   BASE_S / RESIDUAL_S: seconds for each stage (0 skips it); COMPILE_MODE (default "default": max-autotune's compile
#   does not fit the box); RESIDUAL_JOBS / BASE_JOBS: AOTI compile workers for the builds (checks --jobs with ttsaot
#   ops); KERNELS_S: seconds for `bench kernels --sections $KERNEL_SECTIONS` first (default copy,configs: the
#   skinny_linear launch-config sweep the autotune lists are chosen from; copy,layer: one layer's ops with and
#   without the L2 prefetch; 0 skips it).
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
run_stage() {  # stage seconds jobs
  [ "$2" -gt 0 ] || return 0
  timeout -s INT -k 10 "$2" python3 -m bench decode-stages --stage "$1" --budget $(($2 - 40)) --jobs "$3" \
    --compile-mode "${COMPILE_MODE:-default}" --out "$OUT" > "$OUT/decode_stages_$1.log" 2>&1
  echo "$1 rc $? at $(( $(date +%s) - T0 )) s"; tail -8 "$OUT/decode_stages_$1.log" | cut -c1-400
}
KERNELS_S=${KERNELS_S:-0}; KERNEL_SECTIONS=${KERNEL_SECTIONS:-copy,configs}
if [ "$KERNELS_S" -gt 0 ]; then
  name=kernel_$(echo "$KERNEL_SECTIONS" | tr , _)
  timeout -s INT -k 10 "$KERNELS_S" python3 -m bench kernels --sections "$KERNEL_SECTIONS" --budget $((KERNELS_S - 30)) \
    --result "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "kernels rc $? at $(( $(date +%s) - T0 )) s"; grep -vE "Warning|warn" "$OUT/$name.log" | cut -c1-200 | tail -30
fi
run_stage base_lm_step "${BASE_S:-300}" "${BASE_JOBS:-1}"
LEFT=$(( 580 - ($(date +%s) - T0) ))
run_stage residual_lm_step "$(( ${RESIDUAL_S:-250} < LEFT ? ${RESIDUAL_S:-250} : LEFT ))" "${RESIDUAL_JOBS:-2}"
