#!/usr/bin/env bash
# old vs new tree: one tiny qwen code2wav+code_predictor default build on CPU, cold (empty package + Inductor caches)
for which in old new; do
  root=$(mktemp -d /tmp/abcpu-XXXX)
  if [ $which = old ]; then PP=/tmp/oldpath; else PP=; fi
  s=$(date +%s.%N)
  PYTHONPATH=$PP TTSAOT_INDUCTOR_CACHE_DIR=$root/ind TORCHINDUCTOR_CACHE_DIR=$root/ind TRITON_CACHE_DIR=$root/tri \
    python3 -m ttsaot.builder.cli build qwen3-tts-12hz --preset tiny --random-weights --device cpu --jobs 2 \
    --out $root/a --cache-dir $root/c > /tmp/ab_$which.log 2>&1
  e=$(date +%s.%N)
  echo "$which rc=$? $(echo "$e - $s" | bc) s" >> /tmp/ab_cpu.txt
  rm -rf $root
done
