#!/usr/bin/env bash
# One device call (issue 16's GPU load test): build the full code2wav with batch buckets up to 16 (parallel
# compiles: also the CUDA check of `build --jobs`), then `examples.serve.load` at c = 1..32, batched vs unbatched.
# Carry .whl (make gpu-wheels): starlette/uvicorn/httpx/prometheus-client are not on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
python3 -m pip install -q --no-deps .whl/*.whl >> "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
build() {
  timeout -s INT 300 build-artifacts build qwen3-tts-12hz --stages code2wav --random-weights --preset full \
    --device cuda --cxx /usr/bin/g++ --batch-buckets 1,4,16 --frame-buckets 25,50 --nonstreaming-chunk-frames 0 \
    --no-cache --out /tmp/art "$@"
}
build --jobs 6 > "$OUT/build.log" 2>&1; rc=$?
echo "build --jobs 6: rc $rc at $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/build.log"
if [ $rc != 0 ]; then build --jobs 1 > "$OUT/build_serial.log" 2>&1; echo "build --jobs 1: rc $? at $(( $(date +%s) - T0 )) s"; fi
build-artifacts inspect /tmp/art/qwen3-tts-12hz > "$OUT/inspect.txt" 2>&1
LEFT=$(( 560 - ($(date +%s) - T0) ))
echo "load test budget $LEFT s"
timeout -s INT $LEFT python3 -m examples.serve.load --artifacts /tmp/art/qwen3-tts-12hz --out "$OUT/results" \
  --concurrency 1,2,4,8,16,32 --budget-s $(( LEFT - 20 )) > "$OUT/load.log" 2>&1
echo "load rc $? at $(( $(date +%s) - T0 )) s"; tail -25 "$OUT/load.log"
