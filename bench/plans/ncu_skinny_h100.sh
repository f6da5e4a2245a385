#!/usr/bin/env bash
# One device call (~3 minutes, H100): Nsight Compute's counters of skinny_linear where it falls short of the copy
# (bench/probes/ncu_skinny.py: the LocDiT projections at 22 rows, two references that reach the copy, and a
# same-bytes D2D copy after each). → $OUT/skinny.ncu-rep, $OUT/details.txt (every section, per kernel),
# $OUT/raw.csv (the metrics, one row per kernel). EXTRA_SECTIONS="--section SourceCounters" adds the sampled
# warp stalls by location. Clocks left as they are (--clock-control none: METHOD.md).
. "$(dirname "$0")/setup_device.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout -k 10 "${LIMIT_S:-400}" "$NCU" --profile-from-start off --clock-control none --nvtx \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
  --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis ${EXTRA_SECTIONS:-} \
  -f -o "$OUT/skinny" python3 -m bench.probes.ncu_skinny > "$OUT/ncu_run.txt" 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"
"$NCU" --import "$OUT/skinny.ncu-rep" --page details --print-nvtx-rename kernel > "$OUT/details.txt" 2>&1
"$NCU" --import "$OUT/skinny.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
tail -5 "$OUT/ncu_run.txt"
grep -E "^  [a-zA-Z_]|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Stall|Warp Cycles Per Issued|Dynamic Shared" \
  "$OUT/details.txt" | cut -c1-160 | head -150
