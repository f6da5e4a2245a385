#!/usr/bin/env bash
# One device call: stages built from two source trees and timed in turn on the same GPU — A: this tree, B: OTHER (a
# `git archive` of another commit carried beside this one; its builder and runtime shadow the installed ones through
# PYTHONPATH), C: this tree with TTSAOT_PDL=0, `stream`: this tree with TTSAOT_SKINNY_STREAM=1 (skinny_linear's
# streamed tile form), `swap`: this tree with TTSAOT_SKINNY_SWAP_AB=1 (the tile form as W · xᵀ on warpgroup MMAs),
# `streampdl`: the streamed form with the programmatic-launch attribute up to 16-row buckets
# (TTSAOT_PDL_MAX_ROWS=16), `pdl16`: the default tile form with it, `nopreload`: this tree with TTSAOT_GEMV_PRELOAD=0 (no one-row call loads its W before the
# wait), `fused`: this tree with TTSAOT_QKV_ATTENTION=1 (the predictors' qkv projection and attention in one
# launch, kernels/qkv_attention.py), `whole1` / `whole2` / `whole4` / `whole8`: this tree with the whole-cache attention at that
# many warps (TTSAOT_WHOLE_ATTENTION_WARPS, not autotuned), `nonormout`: this tree with TTSAOT_NORM_OUT=0 (every RMSNorm
# in the next projection's prologue, none handed to the projection before), `noearly`: this tree with
# TTSAOT_ATTENTION_EARLY_BLOCK=0 (no split attention loads its first cache block before its PDL wait), `attno` / `noattno`: this tree with TTSAOT_ATTENTION_O=1 / 0 (the LocDiT layers' attention inside o_proj, or not), D (`alt`, optional): a third tree ALT carried like OTHER — `bench
# build` of all of them side by side (caches apart), then `bench profile` of each, one at a time. $OUT/<variant>/:
# the profile JSONs; the logs and tables in one tarball.
#   OTHER=../.snap_old STAGES="voxcpm2/locdit voxcpm2/local_encoder" AXIS=batch=1 bash bench/plans/stage_ab_h100.sh
#   ALT=../.snap_alt VARIANTS="new old alt" OTHER=../.snap_old bash bench/plans/stage_ab_h100.sh
#   VARIANTS="new stream" bash bench/plans/stage_ab_h100.sh   (no second tree needed)
#   VERIFY=1 ...: the builds verified (the builder loads each package and checks it against eager) as users' are
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s)
STAGES=${STAGES:-voxcpm2/locdit voxcpm2/local_encoder}; AXIS=${AXIS:-batch=1}; BUILD_S=${BUILD_S:-360}
END_S=${END_S:-570}; JOBS=${JOBS:-2}
NO_VERIFY=--no-verify; [ "${VERIFY:-0}" = 1 ] && NO_VERIFY=  # VERIFY=1: each build loaded and checked against eager
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
HERE=$PWD
if [ -n "${OTHER:-}" ]; then
  OTHER=$(cd "$OTHER" && pwd); SHADOW=$(mktemp -d)/pkg; mkdir -p "$SHADOW/ttsaot"
  ln -s "$OTHER/builder" "$SHADOW/ttsaot/builder" && ln -s "$OTHER/runtime" "$SHADOW/ttsaot/runtime"
fi
if [ -n "${ALT:-}" ]; then
  ALT=$(cd "$ALT" && pwd); SHADOW_ALT=$(mktemp -d)/pkg; mkdir -p "$SHADOW_ALT/ttsaot"
  ln -s "$ALT/builder" "$SHADOW_ALT/ttsaot/builder" && ln -s "$ALT/runtime" "$SHADOW_ALT/ttsaot/runtime"
fi
variant() {  # NAME: run the rest of the line in that variant's tree and environment
  local name=$1; shift
  case $name in
    new) (cd "$HERE" && "$@") ;;
    old) (cd "${OTHER:?OTHER: a second source tree}" && PYTHONPATH="$SHADOW" "$@") ;;
    nopdl) (cd "$HERE" && TTSAOT_PDL=0 "$@") ;;
    stream) (cd "$HERE" && TTSAOT_SKINNY_STREAM=1 "$@") ;;
    swap) (cd "$HERE" && TTSAOT_SKINNY_SWAP_AB=1 "$@") ;;
    streampdl) (cd "$HERE" && TTSAOT_SKINNY_STREAM=1 TTSAOT_PDL_MAX_ROWS=16 "$@") ;;
    pdl16) (cd "$HERE" && TTSAOT_PDL_MAX_ROWS=16 "$@") ;;
    nopreload) (cd "$HERE" && TTSAOT_GEMV_PRELOAD=0 "$@") ;;
    fused) (cd "$HERE" && TTSAOT_QKV_ATTENTION=1 "$@") ;;
    whole1|whole2|whole4|whole8) (cd "$HERE" && TTSAOT_WHOLE_ATTENTION_WARPS=${name#whole} "$@") ;;
    nonormout) (cd "$HERE" && TTSAOT_NORM_OUT=0 "$@") ;;
    noearly) (cd "$HERE" && TTSAOT_ATTENTION_EARLY_BLOCK=0 "$@") ;;
    attno) (cd "$HERE" && TTSAOT_ATTENTION_O=1 "$@") ;;
    noattno) (cd "$HERE" && TTSAOT_ATTENTION_O=0 "$@") ;;
    alt) (cd "$ALT" && PYTHONPATH="$SHADOW_ALT" "$@") ;;
  esac
}
VARIANTS=${VARIANTS:-new old nopdl}
for v in $VARIANTS; do
  variant "$v" timeout -s INT -k 10 "$BUILD_S" python3 -m bench build $STAGES --axis "$AXIS" $NO_VERIFY --jobs "$JOBS" \
    --cache-dir "/tmp/ab_cache_$v" > "$LOGS/build_$v.log" 2>&1 &
done
wait
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS"/build_*.log | cut -c1-200
for st in $STAGES; do
  for v in $VARIANTS; do
    LEFT=$(( END_S - ($(date +%s) - T0) )); [ "$LEFT" -gt 20 ] || { echo "skipped $st $v (time)"; continue; }
    variant "$v" timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis "$AXIS" --cache-dir "/tmp/ab_cache_$v" \
      --out "$OUT/$v" --calls 10 --reps 50 > "$LOGS/profile_${v}_${st//\//_}.log" 2>&1
    echo "$v $st: $(grep -E '^\[b' "$LOGS/profile_${v}_${st//\//_}.log" | cut -c1-200)"
  done
done
for v in $VARIANTS; do mkdir -p "$LOGS/$v" && mv "$OUT/$v"/*.txt "$LOGS/$v"/ 2>/dev/null; done
if [ -n "${TESTS:-}" ]; then  # then these GPU tests (pytest paths), for what is left of END_S
  python3 -m pip install -q hypothesis pytest-xdist >> "$LOGS/install.txt" 2>&1
  LEFT=$(( END_S - ($(date +%s) - T0) ))
  timeout "$LEFT" python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS > "$LOGS/gpu_tests.txt" 2>&1
  echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -3 "$LOGS/gpu_tests.txt"
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
