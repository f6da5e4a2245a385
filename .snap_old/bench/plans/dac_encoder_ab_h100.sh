#!/usr/bin/env bash
# One device call (issue 15) on the Fish dac_encoder (10 s clip, exact fp32 body): (1) the GPU tests of $GPU_TESTS,
# (2) `bench codec-stages dac_encoder`: the artifact's graph replay against eager, and its codes against exact
# fp32's, (3) `bench profile` of the same package (the codec-stages package cache), (4) with OTHER (a `git archive`
# of another commit carried beside this tree), that tree's build and profile too, in what is left.
#   bash bench/plans/dac_encoder_ab_h100.sh                       → codec_stages.json, new/*.json, logs.tgz
#   OTHER=../.snap_old bash bench/plans/dac_encoder_ab_h100.sh    → and old/*.json
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s); TOTAL_S=${TOTAL_S:-570}
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# shellcheck disable=SC2086
timeout -k 5 120 python3 -m pytest -q -m gpu ${GPU_TESTS:-tests/test_kernels_window_attention.py} > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 "$LOGS/gpu_tests.txt"
CACHE=/tmp/dac_enc_cache
timeout -s INT -k 10 "${CODEC_S:-330}" python3 -m bench codec-stages --stages dac_encoder \
  --variants "${CODEC_VARIANTS:-eager}" --budget $(( ${CODEC_S:-330} - 30 )) --package-cache "$CACHE" --out "$OUT" \
  > "$LOGS/codec_stages.log" 2>&1
echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|return cls.__new__" "$LOGS/codec_stages.log" | tail -6 | cut -c1-400
timeout -s INT -k 10 "$(left)" python3 -m bench profile fish-s2-pro/dac_encoder --axis samples=442368 \
  --cache-dir "$CACHE" --out "$OUT/new" --calls 10 --reps 30 > "$LOGS/profile_new.log" 2>&1
echo "profile new rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^\[s" "$LOGS/profile_new.log" | cut -c1-250
if [ -n "${OTHER:-}" ]; then
  OTHER=$(cd "$OTHER" && pwd); SHADOW=$(mktemp -d)/pkg; mkdir -p "$SHADOW/ttsaot"
  ln -s "$OTHER/builder" "$SHADOW/ttsaot/builder" && ln -s "$OTHER/runtime" "$SHADOW/ttsaot/runtime"
  (cd "$OTHER" && PYTHONPATH="$SHADOW" timeout -s INT -k 10 "$(left)" python3 -m bench profile \
    fish-s2-pro/dac_encoder --axis samples=442368 --cache-dir /tmp/dac_enc_cache_old --out "$OUT/old" --calls 10 \
    --reps 30 > "$LOGS/profile_old.log" 2>&1)
  echo "profile old rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^\[s" "$LOGS/profile_old.log" | cut -c1-250
fi
for v in new old; do [ -d "$OUT/$v" ] && mkdir -p "$LOGS/$v" && mv "$OUT/$v"/*.txt "$LOGS/$v"/ 2>/dev/null; done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
