#!/usr/bin/env bash
# The GPU test suite on the H100 host, timed (issue 17: "GPU test suite under 4 minutes there"). Two device calls on
# one machine (the second within the idle release, the machine keeps the repository's ignored folders):
#   PASS=cold bash bench/plans/gpu_suite_h100.sh   → $OUT/suite_cold.txt  (empty .pytest_artifacts: every package compiled)
#   PASS=warm bash bench/plans/gpu_suite_h100.sh   → $OUT/suite_warm.txt  (the GPU tests' package cache from the cold pass)
# A warm call whose result says `warm: false` got a fresh machine: it was a second cold pass (run 4, gpu_suite/).
# Each pass is stopped with SIGINT at LIMIT_S (default 540 s) so that pytest still prints its summary and durations.
. "$(dirname "$0")/setup_device.sh"
PASS=${PASS:-cold}
# cold: no package cache, and no kernel caches either (a machine that ran a build or a pass before keeps Inductor's
# and Triton's, which a second cold pass on it would otherwise reuse)
[ "$PASS" = cold ] && rm -rf .pytest_artifacts /tmp/ttsaot_inductor_* /tmp/torchinductor_* ~/.triton/cache
# --dist loadgroup: a fixture's tests (xdist_group) go to one worker, and the workers take the tests longest compile
# first (tests/conftest.py longest_compiles_first); DIST=load for the order before. vmstat: is the pass CPU-bound?
(vmstat -n 5 > "$OUT/vmstat_$PASS.txt" 2>&1 &)
# CPU seconds per test item over its worker's process tree (bench/probes/suite_cpu_time.py): what to trim
export TEST_CPU_DIR=$OUT/cpu_$PASS
timeout -s INT -k 20 "${LIMIT_S:-540}" python3 -m pytest -p bench.probes.suite_cpu_time -m gpu -v -n "${WORKERS:-auto}" --dist "${DIST:-loadgroup}" \
  --durations=40 -p no:cacheprovider tests/gpu tests/test_kernels_skinny_linear.py > "$OUT/suite_$PASS.txt" 2>&1
echo "pytest rc $? wall $(( $(date +%s) - T0 )) s" | tee -a "$OUT/suite_$PASS.txt"
pkill vmstat
du -sh .pytest_artifacts/gpu-package-cache 2>&1 | tee -a "$OUT/suite_$PASS.txt"
python3 -m bench.probes.suite_cpu_time "$TEST_CPU_DIR" > "$OUT/cpu_$PASS.txt" 2>&1; head -25 "$OUT/cpu_$PASS.txt"
# one file per xdist worker: archived, as a call returns only a few files
tar czf "$OUT/cpu_$PASS.tar.gz" -C "$OUT" "cpu_$PASS" && rm -rf "$TEST_CPU_DIR"
grep -v DEBUG "$OUT/suite_$PASS.txt" | grep -v '^\s*$' | tail -50 | cut -c1-300
