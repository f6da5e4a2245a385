#!/usr/bin/env bash
# One device call (issue 14): (1) the GPU tests of ttsaot::sample_tokens and skinny_linear's real shapes, (2) the
# sampler kernel timed against the aten sampler (`bench kernels --sections copy,sampler`), (3) the copies
# AOTInductor puts around the kernel layer's ops in a small code_predictor (bench/probes/functional_copies.py),
# with and without the sampler kernel. $OUT: the JSONs and one tarball of logs and traces.
#   OUT=... bash bench/plans/copies_sampler_h100.sh
. "$(dirname "$0")/setup_device.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_sample.py \
  "tests/test_kernels_skinny_linear.py::test_gpu_real_shapes_autotuned" > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -4 "$LOGS/gpu_tests.txt"
for s in "" "--sampler-kernel"; do
  d=$OUT/copies${s:+_sampler}; mkdir -p "$d"
  timeout 150 python3 -m bench.probes.functional_copies --out "$d" $s > "$LOGS/copies${s:+_sampler}.txt" 2>&1
  echo "copies $s at $(( $(date +%s) - T0 )) s:"; head -c 3000 "$LOGS/copies${s:+_sampler}.txt"
  mv "$d/functional_copies.json" "$OUT/functional_copies${s:+_sampler}.json" 2>/dev/null
  mv "$d" "$LOGS/"
done
timeout 200 python3 -m bench kernels --device cuda --sections copy,sampler --budget 180 --out "$OUT" \
  > "$LOGS/kernels.txt" 2>&1
echo "kernels at $(( $(date +%s) - T0 )) s:"; grep -E "sampler|copy" "$LOGS/kernels.txt" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
