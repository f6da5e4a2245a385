#!/usr/bin/env bash
# One device call (issue 14): `ttsaot::sequence_attention_o` in the LocDiT. 1. the probe's sweep
# (bench/probes/attention_o_fused.py; ATTENTION_O_SPLITS / _BLOCK_NS / _WARPS narrow it, PROBE_S=0 skips it) alone
# on the GPU; 2. split_rule_ab_h200.sh: the GPU tests of TESTS beside verified builds of STAGES (voxcpm2/locdit) for
# VARIANTS (`attno` / `noattno`: this tree with TTSAOT_ATTENTION_O=1 / 0, `old`: OTHER), their graph-replay A/B and
# `bench profile` of PROFILES with the PROFILE_VARIANT (attno) build, within END_S of its own start.
#   mkdir -p .snap/old && git archive <old> builder runtime bench pyproject.toml | tar -x -C .snap/old --exclude=bench/results
#   OTHER=.snap/old BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) TESTS="-k 'x or y' tests/a.py" \
#     bash bench/plans/attention_o_ab_h200.sh   (carry .snap)
. "$(dirname "$0")/setup_device.sh"
if [ "${PROBE_S:-150}" -gt 0 ]; then  # PROBE_S=0: no probe
  timeout "${PROBE_S:-150}" python3 -m bench.probes.attention_o_fused "$OUT/attention_o.json" cuda \
    > "$OUT/attention_o.txt" 2>&1
  echo "probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-200 "$OUT/attention_o.txt" | tail -16
fi
STAGES=${STAGES:-voxcpm2/locdit} VARIANTS=${VARIANTS:-attno noattno old} PROFILE_VARIANT=${PROFILE_VARIANT:-attno} \
  TESTS=${TESTS-} OUT=$OUT exec bash "$(dirname "$0")/split_rule_ab_h200.sh"
