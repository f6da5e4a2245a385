#!/usr/bin/env bash
# One device call (issue 17): the codec decoders' attention on `ttsaot::window_attention` (this tree, "new") against
# PyTorch's masked SDPA, which runs cuDNN's attention in bf16 (OLD: a `git archive` of the commit before, carried
# beside this one; its builder, runtime and bench shadow the installed ones through PYTHONPATH).
# 1. bench.probes.sdpa_backends --skip-aoti: the attention alone at the decoders' shapes, by backend.
# 2. `bench build` of STAGES (Fish dac_decoder + Qwen code2wav, bf16, at AXIS) from both trees side by side.
# 3. bench.probes.coldstart_warmups on the four artifacts, alternating (fresh processes, one warm-up call).
# 4. `bench profile` of each stage from each tree, one at a time (per-call time, kernels), in PROFILE_ORDER (e.g.
#    "old new old new": the order alternates, so a drift in the host's timing shows as a difference between rounds).
# 3b. bench.probes.replay_ab per family: the graph replays alone, the two builds alternating (REPLAY_ROUNDS rounds).
# SKIP_SDPA=1 skips 1, REPEATS=0 skips 3, REPLAY_ROUNDS=0 skips 3b, PROFILE_ORDER="" skips 4.
# 5. the window-attention GPU tests.
#   OLD=.snap/old bash bench/plans/window_attention_ab_h100.sh   (run with carry [".snap"])
. "$(dirname "$0")/setup_device.sh"
STAGES=${STAGES:-fish-s2-pro/dac_decoder qwen3-tts-12hz/code2wav}; AXIS=${AXIS:-batch=1,4}
HERE=$PWD; OLD=$(cd "${OLD:?OLD: the other source tree}" && pwd)
SHADOW=$(mktemp -d)/pkg; mkdir -p "$SHADOW/ttsaot"
ln -s "$OLD/builder" "$SHADOW/ttsaot/builder" && ln -s "$OLD/runtime" "$SHADOW/ttsaot/runtime"
in_tree() {  # new|old COMMAND...: run in that tree
  local v=$1; shift
  if [ "$v" = new ]; then (cd "$HERE" && "$@"); else (cd "$OLD" && PYTHONPATH="$SHADOW" "$@"); fi
}
[ -n "${SKIP_SDPA:-}" ] || timeout 120 python3 -m bench.probes.sdpa_backends --out "$OUT/sdpa" --skip-aoti > "$LOGS/sdpa.txt" 2>&1
echo "sdpa probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-220 "$LOGS/sdpa.txt" | grep -v "^\s*$" | tail -24
for v in new old; do
  in_tree $v timeout -s INT -k 10 "${BUILD_S:-300}" python3 -m bench build $STAGES --axis "$AXIS" --no-verify --jobs 2 \
    --cache-dir "/tmp/wa_cache_$v" > "$LOGS/build_$v.log" 2>&1 &
done
wait
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build\|built\|error\|Error" "$LOGS"/build_*.log | cut -c1-200 | tail -12
ARTS=()
for v in new old; do
  for m in $(find "/tmp/wa_cache_$v" -name manifest.json); do
    d=$(dirname "$m"); ARTS+=(--artifact "${v}_$(basename "$d")=$d")
  done
done
echo "artifacts: ${ARTS[*]}"
[ "${REPEATS:-3}" = 0 ] || timeout "${COLD_S:-150}" python3 -m bench.probes.coldstart_warmups "${ARTS[@]}" --calls 1 --repeats "${REPEATS:-3}" \
  --out "$OUT/coldstart" > "$LOGS/coldstart.txt" 2>&1
echo "cold starts at $(( $(date +%s) - T0 )) s:"; grep -E "^rep" "$LOGS/coldstart.txt" | cut -c1-220
for fam in fish-s2-pro qwen3-tts-12hz; do  # the graph replays alone, the builds alternating (bench.probes.replay_ab)
  [ "${REPLAY_ROUNDS:-5}" = 0 ] && break
  A=(); for v in new old; do m=$(find "/tmp/wa_cache_$v" -path "*/$fam/manifest.json" | head -1); A+=(--artifact "$v=$(dirname "$m")"); done
  timeout 120 python3 -m bench.probes.replay_ab "${A[@]}" --rounds "${REPLAY_ROUNDS:-5}" --out "$OUT/replay_$fam" \
    > "$LOGS/replay_$fam.txt" 2>&1; echo "replay $fam at $(( $(date +%s) - T0 )) s:"; tail -14 "$LOGS/replay_$fam.txt"
done
I=0
for v in ${PROFILE_ORDER-new old}; do
  I=$((I + 1))
  for st in $STAGES; do
    LEFT=$(( 540 - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "skipped profile $st $v (time)"; continue; }
    in_tree $v timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis "$AXIS" --cache-dir "/tmp/wa_cache_$v" \
      --out "$OUT/profile_${v}_$I" --calls 10 --reps 50 > "$LOGS/profile_${v}_${I}_${st//\//_}.log" 2>&1
    echo "$v ($I) $st: $(grep -E '^\[b' "$LOGS/profile_${v}_${I}_${st//\//_}.log" | cut -c1-200)"
  done
done
LEFT=$(( 585 - ($(date +%s) - T0) ))
if [ "$LEFT" -gt 20 ]; then
  timeout -s INT -k 5 "$LEFT" python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_kernels_window_attention.py \
    > "$LOGS/gpu_tests.txt" 2>&1; echo "gpu tests: $(grep -cE ' PASSED' "$LOGS/gpu_tests.txt") passed, \
$(grep -cE ' FAILED| ERROR' "$LOGS/gpu_tests.txt") failed/errors"
fi
for d in "$OUT"/profile_*; do mkdir -p "$LOGS/${d##*/}" && mv "$d"/*.txt "$LOGS/${d##*/}"/ 2>/dev/null; done
rm -f "$OUT"/coldstart/*.pt
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
