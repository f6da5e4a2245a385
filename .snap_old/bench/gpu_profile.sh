#!/usr/bin/env bash
# One call on the GPU machine (repo root, no network): `python -m bench profile` of the decode stages with both
# kernel choices (the Triton kernel layer and Inductor's own code) from this checkout. The artifacts are built
# first, in parallel, into the bench cache; then each (stage, kernels) is profiled in its own time-boxed process.
# Results: bench/results/<device>/profiles/<family>__<stage>__<kernels>.{json,txt}, packed into
# $OUT/profiles.tar.gz, with every table in $OUT/profiles.txt.
#
#   bash bench/gpu_profile.sh                          # voxcpm2 base_lm_step, B=1 and 16 (2 builds, < 4 min)
#   PROFILE_TARGETS="voxcpm2/residual_lm_step voxcpm2/locdit" bash bench/gpu_profile.sh      # a second call
#   PROFILE_TARGETS="fish-s2-pro/fast_ar qwen3-tts-12hz/code_predictor" PROFILE_AXES="--axis batch=1,8" ...
#
# Environment (all optional): PROFILE_TARGETS (FAMILY/STAGE ...), PROFILE_KERNELS (default "ttsaot inductor"),
# PROFILE_AXES (extra profile arguments, default "--axis batch=1,16"), PROFILE_BUDGET (seconds in all, default 225;
# the builds get all but the last 70 s, each profile what is left),
# BENCH_GIT_COMMIT (recorded in the JSON: the GPU copy of the tree has no .git), OUT.
set -u
cd "$(dirname "$0")/.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOG=$OUT/profile_log.txt
: >"$LOG"
TARGETS=${PROFILE_TARGETS:-voxcpm2/base_lm_step}
KERNELS=${PROFILE_KERNELS:-ttsaot inductor}
AXES=${PROFILE_AXES:---axis batch=1,16}
BUDGET=${PROFILE_BUDGET:-225}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || echo "pip install -e . failed" | tee -a "$LOG"
# shellcheck disable=SC2086
read -r -a AXIS_ARGS <<<"$AXES"
N=$(wc -w <<<"$TARGETS"); K=$(wc -w <<<"$KERNELS")
echo "== build ($N stages × $K kernel choices, budget $(left) s)" | tee -a "$LOG"
# shellcheck disable=SC2086
timeout -k 5 $(( $(left) - 70 )) python3 -m bench build --no-verify --jobs $(( N * K )) --kernels "$(tr ' ' , <<<"$KERNELS")" \
    "${AXIS_ARGS[@]}" $TARGETS 2>&1 | tee -a "$LOG"
for target in $TARGETS; do
    for kernels in $KERNELS; do
        t=$(left)
        [ "$t" -lt 15 ] && { echo "-- $target $kernels: skipped (budget used up)" | tee -a "$LOG"; continue; }
        echo "== profile $target --kernels $kernels (timeout ${t}s)" | tee -a "$LOG"
        timeout -k 5 "$t" python3 -m bench profile "$target" --kernels "$kernels" "${AXIS_ARGS[@]}" \
            >>"$OUT/profiles.txt" 2>>"$LOG" || echo "-- $target $kernels: exit $?" | tee -a "$LOG" "$OUT/profiles.txt"
    done
done
tar czf "$OUT/profiles.tar.gz" bench/results/*/profiles 2>>"$LOG"
echo "== done in $(( $(date +%s) - T0 )) s" | tee -a "$LOG"
cat "$OUT/profiles.txt"
