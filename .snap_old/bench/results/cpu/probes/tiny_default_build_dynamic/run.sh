#!/bin/bash
# Tiny default CPU builds of commit 4c8a2cf (a snapshot of builder/ + runtime/ on PYTHONPATH, so that edits in the
# shared checkout cannot change the code or the cache keys mid-run), each cold with empty package + Inductor
# caches, then a warm no-change rebuild of each, then `verify` of each artifact.
export PYTHONPATH=/tmp/snap CXX=${CXX:-/usr/bin/g++} COLUMNS=120
cd /tmp/meas2
run() {  # name, log, extra args...
  local fam=$1 log=$2; shift 2
  { echo "\$ TTSAOT_INDUCTOR_CACHE_DIR=/tmp/meas2/ind_$fam build-artifacts build $fam --preset tiny --random-weights --device cpu --out /tmp/meas2/out_$fam --cache-dir /tmp/meas2/pc_$fam $*"; echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; } > $log
  s=$(date +%s.%N)
  TTSAOT_INDUCTOR_CACHE_DIR=/tmp/meas2/ind_$fam build-artifacts build $fam --preset tiny --random-weights --device cpu --out /tmp/meas2/out_$fam --cache-dir /tmp/meas2/pc_$fam "$@" 2>&1 | grep -v "FutureWarning\|return cls.__new__" >> $log
  rc=${PIPESTATUS[0]}
  e=$(date +%s.%N)
  echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $log
  echo "wall $(echo "$e - $s" | bc) s" >> $log; echo "rc $rc" >> $log
}
fresh() { rm -rf /tmp/meas2/out_$1 /tmp/meas2/pc_$1 /tmp/meas2/ind_$1; }
fresh qwen3-tts-12hz; run qwen3-tts-12hz cold_qwen3-tts-12hz_jobs1.log --jobs 1
fresh qwen3-tts-12hz; run qwen3-tts-12hz cold_qwen3-tts-12hz.log
run qwen3-tts-12hz warm_qwen3-tts-12hz.log
for fam in fish-s2-pro voxcpm2; do fresh $fam; run $fam cold_$fam.log; run $fam warm_$fam.log; done
for fam in qwen3-tts-12hz fish-s2-pro voxcpm2; do
  { echo "\$ build-artifacts verify /tmp/meas2/out_$fam/$fam"; build-artifacts verify /tmp/meas2/out_$fam/$fam 2>&1 | grep -v "FutureWarning\|return cls.__new__" | tail -n 40; echo "rc ${PIPESTATUS[0]}"; } > verify_$fam.log
done
echo done > ALLDONE
