#!/usr/bin/env bash
# One cold tiny default CPU build through the CLI (--jobs 2, empty package / Inductor / Triton caches), timed.
#   bash ab_cpu_build.sh new voxcpm2                          # the installed (this) tree
#   OLD_TREE=.snap/old bash ab_cpu_build.sh old voxcpm2 SHADOW  # SHADOW/ttsaot/{builder,runtime} -> OLD_TREE's
L=$1; F=$2; D=/tmp/tb_${L}_$F; rm -rf "$D"; mkdir -p "$D"
export TTSAOT_CACHE_DIR=$D/pc TTSAOT_INDUCTOR_CACHE_DIR=$D/ind TRITON_CACHE_DIR=$D/tri
t0=$(date +%s.%N)
if [ -n "${3:-}" ]; then cd ${OLD_TREE:?a git archive of the old commit} && PYTHONPATH=$3 python3 -m ttsaot.builder.cli build $F --preset tiny --random-weights --device cpu --jobs 2 --out $D/out > $D/log 2>&1
else python3 -m ttsaot.builder.cli build $F --preset tiny --random-weights --device cpu --jobs 2 --out $D/out > $D/log 2>&1; fi
rc=$?; t1=$(date +%s.%N)
echo "$L $F rc=$rc wall=$(echo "$t1 - $t0" | bc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
