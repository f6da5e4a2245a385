#!/usr/bin/env bash
# One device call (issue 17): where one AOTI compile of a FULL code2wav bucket (b1 × 50 frames, --jobs 1, so the
# compile runs in the build process) spends its time: cProfile of the build, every C++ compiler call timed through
# a logging wrapper, run three times — empty kernel cache; the same bucket again on the cache the first run left; once more with the
# AOTI wrapper compiled at -O0. At most 8 files come back: profile/{cold,warm,o0}.txt, {cold,o0}.log, cxx.txt, smi.
#   bash bench/plans/compile_profile_h100.sh
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/profile"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.txt 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
cat > /tmp/timed-gxx <<'SH'
#!/usr/bin/env bash
s=$(date +%s.%N); /usr/bin/g++ "$@"; rc=$?
echo "$(python3 -c "import time;print(round(time.time()-$s,2))") s rc $rc: $(echo "$@" | tr ' ' '\n' | grep -E '\.(cpp|o|so)$' | xargs -n1 basename 2>/dev/null | tr '\n' ' ')" >> /tmp/cxx.txt
exit $rc
SH
chmod +x /tmp/timed-gxx; export CXX=/tmp/timed-gxx; : > /tmp/cxx.txt
rm -rf /tmp/probe-kcache
for run in cold warm o0; do
  if [ $run = o0 ]; then export AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0; fi
  s=$(date +%s.%N); echo "== $run" >> /tmp/cxx.txt
  TTSAOT_INDUCTOR_CACHE_DIR=/tmp/probe-kcache timeout -s INT -k 10 "${STEP_S:-200}" python3 -m cProfile \
    -o "/tmp/$run.prof" -m ttsaot.builder.cli build qwen3-tts-12hz --preset full --random-weights \
    --device cuda --stages code2wav --no-cache --no-verify --jobs 1 --batch-buckets 1 --no-pow2 --frame-buckets 50 \
    --out "/tmp/probe-art-$run" > "/tmp/$run.log" 2>&1; rc=$?
  [ $run = warm ] || grep -v "Warning\|__new__\|frombuffer" "/tmp/$run.log" | tail -30 > "$OUT/profile/$run.log"
  echo "$run rc $rc wall $(python3 -c "import time;print(round(time.time()-$s,1))") s (at $(( $(date +%s) - T0 )) s)"
  python3 - "/tmp/$run.prof" > "$OUT/profile/$run.txt" 2>&1 <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1])
p.sort_stats("cumulative").print_stats(70)
p.sort_stats("tottime").print_stats(30)
PY
done
cp /tmp/cxx.txt "$OUT/profile/cxx.txt"; cat /tmp/cxx.txt | cut -c1-200
du -sh /tmp/probe-kcache/*/* 2>/dev/null | sort -h | tail -8
