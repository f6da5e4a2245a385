#!/usr/bin/env bash
# One device call (issue 14): each radix variant of ttsaot::sample_tokens first alone, in its own process under a
# timeout (bench/probes/sampler_variant.py: a variant that hangs the GPU is named, not fatal), then `bench kernels`
# copy + sampler + the sweep over the variants that ran (kernels_sampler.json), then the sampler's GPU tests.
#   OUT=... bash bench/plans/sampler_sweep_h100.sh
. "$(dirname "$0")/setup_device.sh"
OK=""
for skip in 0 1; do
  for bits in 4 2 1; do
    if timeout 60 python3 -m bench.probes.sampler_variant 4096 "$bits" "$skip" >> "$OUT/variants.txt" 2>&1; then
      OK="$OK $bits:$skip"
    else
      echo "V=4096 bits=$bits skip=$skip: FAILED rc=$?" >> "$OUT/variants.txt"
    fi
  done
done
echo "variants at $(( $(date +%s) - T0 )) s: ok$OK"; grep "V=" "$OUT/variants.txt"
OK="$OK" timeout 330 python3 - > "$LOGS/sweep.txt" 2>&1 <<'PY'
import os, torch, bench.kernels as kb
from pathlib import Path
from bench.common import write_json
ok = {tuple(int(x) for x in v.split(":")) for v in os.environ["OK"].split()}
items = [(k, kw) for k, kw in kb.sampler_sweep_items(warp_factors=(1, 2))
         if kw["variant"]["sort"] or (kw["variant"]["digit_bits"], int(kw["variant"]["skip_off"])) in ok]
kb.sampler_sweep_items = lambda *a, **k: items
out = Path(os.environ["OUT"]) / "kernels_sampler.json"
r = kb.run_kernels(torch.device("cuda"), False, 300, ("copy", "sampler", "sweep_sampler"), False,
                   progress=lambda res: write_json(out, res))
write_json(out, r)
print(kb.summary(r))
PY
echo "sweep at $(( $(date +%s) - T0 )) s"; grep -E "sampler|copy" "$LOGS/sweep.txt" | tail -120
LEFT=$(( 560 - ($(date +%s) - T0) ))
[ "$LEFT" -gt 30 ] && timeout "$LEFT" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_sample.py \
  > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
