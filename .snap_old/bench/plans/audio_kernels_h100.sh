#!/usr/bin/env bash
# One device call: VoxCPM2 locdit and local_encoder on the kernel layer (--kernels ttsaot, use_sequence_kernels) vs
# Inductor (--kernels inductor), same weights (full preset, bf16, seed 0). The build named by PROFILED (default
# locdit:ttsaot, never yet finished on a GPU within a 160 s budget) runs in this shell's process under cProfile
# (`bench profile` builds what the cache lacks), the other three beside it (bench build, the cache bench profile
# reuses); then per stage and choice: `bench profile` (call time, kernels per call / per layer, top kernels, GB/s)
# and `ttsaot.runtime.verify --json` (the artifact's golden cases on the GPU against the fp32 eager reference, limit =
# the manifest tolerance). $OUT gets the summary JSON, the profile JSONs and one tarball of the rest (at most 8 files
# come back from a device call).
#   AXIS=batch=1,4 bash bench/plans/audio_kernels_h100.sh        (default batch=1; the kernels run up to 32 rows:
#   locdit's DiT layers are 2·B·11 rows, the encoder's B·5, so batch 1 is where both run the Triton kernels)
# CPU smoke (the profile's CPU default is fp32, so name it for the build too):
#   DEVICE=cpu PRESET=tiny DTYPE=fp32 BUILD_S=900 bash bench/plans/audio_kernels_h100.sh
set -u
cd "$(dirname "$0")/../.."
# always /usr/bin/g++, never an inherited $CXX: the device's preset wrapper builds packages that segfault on load
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$OUT/profiles" "$LOGS"; T0=$(date +%s)
PY=${PY:-python3}; AXIS=${AXIS:-batch=1}; DEVICE=${DEVICE:-cuda}; PRESET=${PRESET:-full}
SUFFIX=${DTYPE:+:$DTYPE}; TAG=${DTYPE:+__$DTYPE}   # bench profile names its JSON voxcpm2__STAGE[__DTYPE]__KERNELS
STAGES="locdit local_encoder"; CHOICES="ttsaot inductor"; PROFILED=${PROFILED:-locdit:ttsaot}; BUILD_S=${BUILD_S:-380}
[ -n "${SKIP_INSTALL:-}" ] || $PY -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
COMMON=(--axis "$AXIS" --device "$DEVICE" --preset "$PRESET")
profile() {  # STAGE CHOICE SECONDS PYTHON...: bench profile (builds what the cache lacks), then the golden cases
  local st=$1 k=$2 s=$3; shift 3
  timeout -s INT -k 10 "$s" "$@" -m bench profile "voxcpm2/$st$SUFFIX" --kernels "$k" "${COMMON[@]}" \
    --out "$OUT/profiles" --calls "${CALLS:-10}" --reps "${REPS:-30}" > "$LOGS/profile_${st}_${k}.log" 2>&1
  echo "profile $st $k rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^\[b|kernels=" "$LOGS/profile_${st}_${k}.log" | cut -c1-250
  art=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['build']['path'])" \
        "$OUT/profiles/voxcpm2__${st}${TAG}__${k}.json" 2>/dev/null)
  if [ -n "$art" ]; then
    timeout -s INT -k 10 60 $PY -m ttsaot.runtime.verify "$art" --device "$DEVICE" --stages "$st" --json \
      > "$LOGS/verify_${st}_${k}.json" 2> "$LOGS/verify_${st}_${k}.err"
    echo "verify $st $k rc $?"
  fi
}
# the other builds beside the profiled one: bench build takes one --kernels for all its targets, so one per choice
for k in $CHOICES; do
  targets=(); for st in $STAGES; do [ "$st:$k" = "$PROFILED" ] || targets+=("voxcpm2/$st$SUFFIX"); done
  [ ${#targets[@]} -gt 0 ] || continue
  timeout -s INT -k 10 "$BUILD_S" $PY -m bench build "${targets[@]}" --kernels "$k" --no-verify --jobs 2 "${COMMON[@]}" \
    > "$LOGS/build_$k.log" 2>&1 &
done
profile "${PROFILED%:*}" "${PROFILED#*:}" "$BUILD_S" $PY -m cProfile -o "$LOGS/build_profile.prof"
wait
grep -h "bench build" "$LOGS"/build_*.log | cut -c1-300
$PY - "$LOGS/build_profile.prof" > "$LOGS/build_profile.txt" 2>&1 <<'EOF'
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("cumulative").print_stats(70); s.sort_stats("tottime").print_stats(40)
EOF
grep -A45 "ncalls" "$LOGS/build_profile.txt" | head -50 | cut -c1-200
# a step that would start after LIMIT_S seconds is skipped (the summary says so)
for k in $CHOICES; do
  for st in $STAGES; do
    [ "$st:$k" = "$PROFILED" ] && continue
    if [ $(( $(date +%s) - T0 )) -gt "${LIMIT_S:-500}" ]; then echo "skipped $st $k (time)"; continue; fi
    profile "$st" "$k" 60 $PY
  done
done
$PY - "$OUT" "$TAG" <<'EOF'
import json, pathlib, sys
out, tag = pathlib.Path(sys.argv[1]), sys.argv[2]
summary = {"kind": "audio_kernels", "stages": {}}
for st in ("locdit", "local_encoder"):
    row = summary["stages"][st] = {}
    for k in ("ttsaot", "inductor"):
        r = row[k] = {}
        p = out / "profiles" / f"voxcpm2__{st}{tag}__{k}.json"
        if p.is_file():
            prof = json.loads(p.read_text())
            r["device"] = prof["device"]["name"]
            r["manifest_kernels"] = prof.get("manifest_kernels")
            fields = ("call_ms", "x_floor", "kernels_per_call", "kernels_per_layer", "gb_per_s_over_call")
            r["buckets"] = {b: {f: v.get(f) for f in fields} for b, v in prof.get("buckets", {}).items()}
        v = out / "logs" / f"verify_{st}_{k}.json"
        try:
            cases = json.loads(v.read_text().strip().splitlines()[-1])
            r["verify"] = {"ok": all(c["ok"] for c in cases), "cases": len(cases),
                           "worst": max(((c["value"], c["limit"], c["case"]) for c in cases), default=None)}
        except (OSError, IndexError, ValueError) as e:
            r["verify"] = {"ok": False, "error": repr(e)}
    t, i = row["ttsaot"].get("buckets", {}), row["inductor"].get("buckets", {})
    row["inductor_over_ttsaot"] = {b: round(i[b]["call_ms"] / t[b]["call_ms"], 3)
                                   for b in t if b in i and t[b].get("call_ms") and i[b].get("call_ms")}
(out / "audio_kernels_summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
EOF
mv "$OUT"/profiles/*.txt "$LOGS"/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
