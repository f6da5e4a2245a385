#!/usr/bin/env bash
# One device call (issue 14): where a predictor layer's attention time goes (bench/probes/attention_chain.py:
# the attention's warps, its q/k norm and RoPE, in PDL chains at batch 1 on the predictors' shapes).
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/attention_chain_h200.sh
. "$(dirname "$0")/setup_device.sh"
timeout "${PROBE_S:-300}" python3 -m bench.probes.attention_chain "$OUT/attention_chain.json" > "$OUT/attention_chain.txt" 2>&1
echo "probe at $(( $(date +%s) - T0 )) s:"; cut -c1-250 "$OUT/attention_chain.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
