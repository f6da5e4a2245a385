#!/usr/bin/env bash
# One device call: the wired kernel layer end to end on the GPU. decode-stages (VoxCPM2 base_lm_step, --kernels
# ttsaot vs inductor vs eager vs torch.compile + graph, byte floor), then codec-stages for the given tasks.
#   CODEC="code2wav,vae_decoder" DECODE_S=270 DECODE_ARGS="--compile-mode default" CODEC_ARGS="--variants inductor,eager" bash bench/plans/kernel_stages_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
DECODE_S=${DECODE_S:-270}; CODEC=${CODEC:-code2wav,vae_decoder}
if [ "$DECODE_S" -gt 0 ]; then
  timeout -s INT -k 10 "$DECODE_S" python3 -m bench decode-stages --budget $((DECODE_S - 30)) --out "$OUT" ${DECODE_ARGS:-} \
    > "$OUT/decode_stages.log" 2>&1
  echo "decode-stages rc $? at $(( $(date +%s) - T0 )) s"; tail -30 "$OUT/decode_stages.log" | cut -c1-200
fi
LEFT=$(( 575 - ($(date +%s) - T0) ))
if [ -n "$CODEC" ] && [ "$LEFT" -gt 60 ]; then
  timeout -s INT -k 10 "$LEFT" python3 -m bench codec-stages --stages "$CODEC" --budget $((LEFT - 40)) --out "$OUT" ${CODEC_ARGS:-} \
    > "$OUT/codec_stages.log" 2>&1
  echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"; tail -30 "$OUT/codec_stages.log" | cut -c1-200
fi
