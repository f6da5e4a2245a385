#!/usr/bin/env bash
# warm no-change rebuild vs cold, qwen3-tts-12hz code_predictor, tiny preset, CPU, through the CLI
set -u
W=$(mktemp -d); OUTJ=$1
run() { local t0=$(date +%s.%N); build-artifacts build qwen3-tts-12hz --preset tiny --random-weights --device cpu \
  --stages code_predictor --cache-dir "$W/cache" --out "$W/art" > "$W/log_$1.txt" 2>&1; local rc=$?
  local t1=$(date +%s.%N); echo "{\"run\": \"$1\", \"rc\": $rc, \"seconds\": $(python3 -c "print(round($t1-$t0,2))"), \"load1\": $(cut -d' ' -f1 /proc/loadavg)}"; }
{ echo '{"kind": "warm_rebuild_probe", "command": "build-artifacts build qwen3-tts-12hz --preset tiny --random-weights --device cpu --stages code_predictor --cache-dir C --out A", "host_cpus": '"$(nproc)"', "git_commit": "'"$(git rev-parse HEAD)"'", "date": "'"$(date -Is)"'", "runs": ['
  run cold; echo ','; run warm1; echo ','; run warm2; echo ','; run warm3; echo ']}'; } > "$OUTJ"
cat "$OUTJ"
