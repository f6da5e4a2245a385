#!/usr/bin/env bash
# One device call: what ONE package's build costs when it is alone on the 16-core host (wall, CPU seconds of the
# CLI and every child, compiled kernels), for Fish's dac_decoder b1_f50 under build-time settings given as
# VARIANTS ("name:ENV=VALUE,ENV=VALUE ..."; "base:" = as committed). Each variant starts from empty package,
# Inductor and Triton caches. → $OUT/package_cpu.txt (+ one log per variant)
#   VARIANTS="base: o0:AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0" bash bench/plans/package_cpu_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
STAGE=${STAGE:-dac_decoder}; ARGS=${ARGS:---batch-buckets 1 --frame-buckets 50}
for v in ${VARIANTS:-base:}; do
  name=${v%%:*}; envs=${v#*:}; root=$(mktemp -d /tmp/pkgcpu-XXXX)
  (
    export TTSAOT_INDUCTOR_CACHE_DIR=$root/inductor TRITON_CACHE_DIR=$root/triton  # the builder keys its own Inductor cache under this
    for kv in ${envs//,/ }; do export "$kv"; done
    /usr/bin/time -f "$name wall %e s user %U s sys %S s" -o "$OUT/time_$name.txt" build-artifacts build fish-s2-pro \
      --random-weights --preset full --device cuda --out "$root/a" --cache-dir "$root/c" --stages "$STAGE" $ARGS \
      > "$OUT/build_$name.log" 2>&1
  )
  {
    cat "$OUT/time_$name.txt"
    grep -o "compiled ([0-9]*s)" "$OUT/build_$name.log" | head -3 | sed "s/^/$name package /"
    echo "$name cubins $(find "$root/triton" -name '*.cubin' | wc -l), inductor .py kernels $(find "$root/inductor" -name '*.py' | wc -l)"
  } >> "$OUT/package_cpu.txt"
  rm -rf "$root"
done
cat "$OUT/package_cpu.txt"
