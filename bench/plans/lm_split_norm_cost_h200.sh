#!/usr/bin/env bash
# One device call (issue 14): the decode-attention GPU tests (the split form's unrolled merge included), the VoxCPM2
# LM steps' split plans x configs in a layer's PDL chain (bench/probes/attention_chain.py), then what the RMSNorm
# prologue costs the normed projections at their serving rows (`bench kernels --sections copy,norm_cost`).
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/lm_split_norm_cost_h200.sh
. "$(dirname "$0")/setup_device.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/nvidia_smi.txt" 2>&1
timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_decode_attention.py \
  > "$OUT/gpu_tests.txt" 2>&1
echo "tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/gpu_tests.txt"
timeout "${PROBE_S:-200}" python3 -m bench.probes.attention_chain "$OUT/attention_chain.json" cuda \
  voxcpm2_base_lm voxcpm2_residual_lm > "$OUT/attention_chain.txt" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-200 "$OUT/attention_chain.txt" | tail -60
python3 -m bench kernels --sections copy,norm_cost --budget "${KERNELS_S:-150}" --out "$OUT" > "$OUT/kernels.txt" 2>&1
echo "kernels rc $? at $(( $(date +%s) - T0 )) s"; tail -25 "$OUT/kernels.txt" | cut -c1-240
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
