#!/usr/bin/env bash
# logs each compiler call's wall time and its main source/output
t0=$(date +%s.%N)
g++ "$@"; rc=$?
t1=$(date +%s.%N)
src=$(printf '%s\n' "$@" | grep -E '\.(cpp|c|cc)$' | head -3 | xargs -r -n1 basename | tr '\n' ' ')
out=$(printf '%s\n' "$@" | grep -A1 '^-o$' | tail -1 | xargs -r basename)
ol=$(printf '%s\n' "$@" | grep -E '^-O' | tr '\n' ' ')
printf '%.2f rc=%s %s src=[%s] out=%s\n' "$(echo "$t1 - $t0" | bc)" "$rc" "$ol" "$src" "$out" >> /tmp/gxx_calls.log
exit $rc
