"""BENCHMARKS.md from bench/results/<device>/*.json (+ PNG plots under bench/results/plots/ when matplotlib is
importable). Only GPU results are reported unless include_cpu (CPU runs are smoke tests of the harness), except
`python -m bench builds` on a CPU: build time on a CPU machine is a target of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .families import result_sections
from .variants import ALL_VARIANTS

HOW_TO_READ = """\
## How to read these numbers

- **Latency** is the median of individually timed calls (CUDA events around each call on the current
  stream) after warm-up, on random, never all-zero inputs of exactly the bucket's shape; p10/p90 are in the
  JSON. Every variant is timed in the same process on the same inputs, with the same random weights —
  except where a stage's note says it was merged (`bench run --merge`): then the entries marked
  `merged_from` in the JSON come from the named earlier run on the same device and software.
- **Variants**: `eager_raw` = the faithful module (checkpoint layout, no rewrites) cast to the stage dtype;
  `eager` = after the stage's passes (codebook baking, SnakeBeta baking, projection fusion: what is exported);
  `eager_graph` = `eager` captured in a CUDA graph by hand; `compile_graph` = `torch.compile(mode=
  "max-autotune-no-cudagraphs")` + a manual CUDA-graph capture of the compiled callable (the vLLM-Omni
  pattern); `compile_ro` = `torch.compile(mode="reduce-overhead")`; `ttsaot_nograph` / `ttsaot_graph` = the
  built artifact loaded with `cuda_graphs=False` / the default (AOTInductor package + CUDA-graph replay per
  bucket), through the public `Stage.__call__` including input validation (`ms_without_input_validation` in
  the JSON drops the value checks; `ms_eager_input_checks` runs them as eager aten ops, the runtime before each
  bucket replayed them as one captured graph), built with `--kernels auto` (the ttsaot Triton kernel layer on CUDA);
  `ttsaot_inductor` = `ttsaot_graph` of the same stage built with `--kernels inductor` (Inductor's own code
  for the hot paths), from the same checkout and run; `ttsaot_kernels` = the same built with `--kernels ttsaot`
  where `auto` keeps Inductor's code (the opt-in kernel layer); the header names the kernels each manifest records;
  `upstream_*` = the upstream implementation with the same weights.
  Codebook predictors only: `loop_eager_host` = eager forward per codebook step (KV cache) + eager sampling
  + a host read of the codes per step (the reference loop); `loop_compile_graph` = torch.compile'd step
  forward, one CUDA graph per step index, eager sampling between replays (vLLM-Omni); same noise and sampler.
  A variant over its compile budget is recorded as skipped with the reason, never silently dropped.
- **Floor** = max(bytes / copy bandwidth, FLOPs / matmul rate), both rates measured in the same process
  (a 1 GiB device-to-device copy counting bytes read + written; an 8192^3 bf16 matmul). Bytes = the stage's
  weights in the compute dtype + its inputs and outputs (activations inside the stage are assumed to stay on
  chip); FLOPs = `torch.utils.flop_counter.FlopCounterMode` on the faithful module (matmuls, convolutions,
  attention; elementwise work counts zero) at matmul rate. It is a lower bound nothing reaches;
  `×floor` = latency / floor.
- **Parity** = ||out − ref|| / ||ref|| against the fp32 faithful module on the same GPU (TF32 off).
- **Cold start** = wall time from spawning a fresh process to the first output on the host. ttsaot:
  import + load (checks, weights, binding every bucket, capturing every graph) + first call. torch.compile:
  import + module construction with random weights (stands in for reading a checkpoint) + compile with an
  EMPTY Inductor cache + warm-up + capture + first call, for the primary shape only (a lower bound for
  serving several shapes); its mode is in the table.
- **Memory** = `torch.cuda.memory_allocated` / `memory_reserved` deltas around a variant's setup and its
  buckets (weights, static buffers, graph pools) and the peak reserved while running them.
- **Streaming** (codec decoders): a 10 s utterance decoded chunk by chunk with the stage's default streaming
  configuration (chunk + left context, the runtime's `stream()` for ttsaot); TTFA = first chunk's audio ready;
  RTF = decode time / audio duration (lower is better).
- **Throughput** vs batch: items (requests) per second at the primary non-batch sizes; ttsaot pads to the
  smallest fitting bucket or splits batches over the largest one (the bucket used is in the JSON).
- Numbers are for the GPU named in each section, with random weights at the full model configuration.
"""


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.3g}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def load_results(results: Path, include_cpu: bool) -> dict[str, dict[str, Any]]:
    devices: dict[str, dict[str, Any]] = {}
    for d in sorted(p for p in results.iterdir() if p.is_dir() and p.name != "plots") if results.is_dir() else []:
        for f in sorted(d.glob("*.json")) + sorted(d.glob("profiles/*.json")):
            try:
                r = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            dev = r.get("device") or {}
            # CPU build times are published (issue 17 sets a CPU target for them); other CPU runs are harness smoke
            if dev.get("type") != "cuda" and not include_cpu and r.get("kind") != "builds":
                continue
            entry = devices.setdefault(d.name, {"device": dev, "stages": [], "snake": None})
            if not entry["device"]:
                entry["device"] = dev
            if r.get("kind") == "snake_kernel":
                entry["snake"] = r
            elif r.get("kind") == "kernels":
                r["_file"] = f.name
                entry.setdefault("kernels", []).append(r)
            elif r.get("kind") == "profile":
                entry.setdefault("profiles", []).append(r)
            elif r.get("kind") == "conv_kernels":
                r["_file"] = f.name
                entry.setdefault("conv_kernels", []).append(r)
            elif r.get("kind") == "decode_stages":
                r["_file"] = f.name
                entry.setdefault("decode_stages", []).append(r)
            elif r.get("kind") == "builds":  # one file per run: builds.json, builds_<families>.json
                entry.setdefault("builds", []).append(r)
            elif r.get("kind") == "bucket_hits":
                entry[r["kind"]] = r
            elif str(r.get("schema", "")).startswith("codec_stages/"):
                entry.setdefault("codec_stages", []).append(r)
            elif r.get("kind") == "memory":
                entry["memory"] = r
            else:
                r["_file"] = str(f)
                entry["stages"].append(r)
    return devices


LAUNCH_ROWS = 6  # launch shapes per profiled bucket in `launch_shapes_section`


def launch_shapes_section(profiles: list[dict]) -> str:
    """The kernel layer's profiles by kernel and launch shape (bench/profile.py `own_per_launch`, from each bucket's
    one-call timeline): in a decode stage each projection of a layer has its own grid, so the rows are its roles.
    Empty when no profile has a timeline."""
    from .profile import own_per_launch

    rows = []
    for r in sorted(profiles, key=lambda r: (r["stage"]["family"], r["stage"]["stage"])):
        if r["kernels"] != "ttsaot":
            continue
        st = r["stage"]
        for key, b in r.get("buckets", {}).items():
            if not b.get("timeline") or not b.get("own_ms"):
                continue
            for g in own_per_launch(b["timeline"])[:LAUNCH_ROWS]:
                rows.append(
                    [
                        f"{st['family']}/{st['stage']}",
                        f"`{key}`",
                        f"`{g['name'][:40]}`",
                        g["launch"],
                        f"{g['n']}",
                        f"{g['own_us_median']:.2f}",
                        f"{g['own_us']:.1f}",
                        f"{g['own_us'] / (b['own_ms'] * 1e3):.0%}",
                    ]
                )
    if not rows:
        return ""
    header = ["stage", "bucket", "kernel", "launch", "per call", "own µs each", "own µs/call", "of busy"]
    return (
        f"Where the kernel layer's profiled calls spend their time, by kernel and launch shape (the {LAUNCH_ROWS} "
        "largest per bucket; one call's timeline; own µs: a launch's span less what overlaps earlier ones, the "
        "median over its launches; in a decode stage each projection has its own grid):\n\n" + _table(header, rows)
    )


def profiles_section(profiles: list[dict]) -> str:
    """One row per (stage, kernel choice, bucket) of the `bench profile` results (bench/profile.py)."""
    rows = []
    for r in sorted(
        profiles,
        key=lambda r: (r["stage"]["family"], r["stage"]["stage"], r["kernels"], r["settings"].get("graphs", False)),
    ):
        st = r["stage"]
        for key, b in r.get("buckets", {}).items():
            top = b["top"][0] if b.get("top") else None
            rows.append(
                [
                    f"{st['family']}/{st['stage']}",
                    r["kernels"] + ("" if r["settings"].get("graphs") else ", no graph"),
                    f"`{key}`",
                    f"{b['call_ms'] * 1e3:.1f}",
                    f"{b['x_floor']:.2f}×" if b.get("x_floor") else "—",
                    f"{b['x_loop_floor']:.2f}×" if b.get("x_loop_floor") else "—",
                    f"{b['kernels_per_call']:g}",
                    f"{b['kernels_per_layer']:g}" if "kernels_per_layer" in b else "—",
                    f"{b['kernel_ms'] * 1e3:.1f}",
                    f"{b['gap_ms'] * 1e3:.1f}",
                    f"{b['own_ms'] * 1e3:.1f}" if "own_ms" in b else "—",
                    f"{b['gb_per_s_over_kernels']:.0f}" if "gb_per_s_over_kernels" in b else "—",
                    f"`{top['name'][:48]}` {top['share']:.0%}" if top and top.get("share") is not None else "—",
                ]
            )
    header = [
        "stage",
        "kernels",
        "bucket",
        "call µs",
        "× floor",
        "× loop floor",
        "kernels/call",
        "per layer",
        "kernel µs",
        "gap µs",
        "busy µs",
        "GB/s (kernels)",
        "top kernel (share)",
    ]
    return (
        "Profiles (`python -m bench profile`; top kernels per bucket in `profiles/*.txt`; × floor: bytes = weights "
        "once + inputs/outputs; × loop floor, for a looped stage: its transformer stack's weights again for every "
        "further pass, `bench/floor.py` `loop_weight_bytes`; GB/s counts weights once, a lower bound for a "
        "looped stage; busy µs: the kernels' spans with their overlaps counted once, where programmatic launch makes "
        "the kernel sum pass the call; — in profiles made before it was recorded):\n\n" + _table(header, rows)
    )


def decode_stages_section(res: dict) -> str:
    """`bench decode-stages`: the summary, then each artifact's graph-replay profile per batch bucket."""
    from .decode_stages import summary

    rows = []
    for key, sec in res.get("sections", {}).items():
        for kind in ("ttsaot", "ttsaot_nopdl", "inductor"):
            p = sec.get(kind, {}).get("profile") if key.startswith("B=") else None
            if not p or "top" not in p:
                continue
            top = "; ".join(f"`{r['name'][:40]}` ×{r['per_call']:g} {r['us_per_call']:.0f} µs" for r in p["top"][:3])
            rows.append(
                [
                    key,
                    kind,
                    f"{p['call_ms'] * 1e3:.1f}",
                    f"{p['x_floor']:.2f}×",
                    f"{p['kernels_per_call']:g}",
                    f"{p.get('kernels_per_layer', '—')}",
                    f"{p['kernel_ms'] * 1e3:.1f}",
                    f"{p['gap_ms'] * 1e3:.1f}",
                    f"{p.get('gb_per_s_over_kernels', 0):.0f}",
                    top,
                ]
            )
    cfg = res.get("config", {})
    text = (
        f"Decode step `{res.get('stage')}` (`python -m bench decode-stages`, `{res['_file']}`; {cfg.get('layers')} "
        f"of {cfg.get('model_layers')} layers, ctx {cfg.get('context')}, bf16; replay ms and × the byte floor; "
        f"torch.compile mode `{cfg.get('compile_mode')}`):\n\n```text\n{summary(res)}\n```\n"
    )
    if rows:
        overlap = any(r[7].startswith("-") for r in rows)
        text += (
            "\nProfiles of the runtime graphs (torch.profiler over 20 replays"
            + (
                "; with programmatic dependent launch the kernels overlap, so their summed time exceeds the replay, "
                "the gap is negative and GB/s over kernel time understates the bandwidth"
                if overlap
                else ""
            )
            + "):\n\n"
            + _table(
                [
                    "bucket",
                    "kernels",
                    "replay µs",
                    "× floor",
                    "kernels/call",
                    "per layer",
                    "kernel µs",
                    "gap µs",
                    "GB/s (kernels)",
                    "top kernels",
                ],
                rows,
            )
            + "\n"
        )
    return text


def _variant_order(res: dict) -> list[str]:
    names = list(res.get("variants", {}))
    return [v for v in ALL_VARIANTS if v in names] + [v for v in names if v not in ALL_VARIANTS]


def _stage_section(res: dict, plots: dict[str, str]) -> str:
    ok = [v for v in _variant_order(res) if res["variants"][v].get("buckets")]  # partial runs keep measured cells
    lines = _stage_header(res)
    lines += _latency_table(res, ok, plots)
    lines += _parity_table(res, ok)
    lines += _params_and_build(res)
    lines += _cold_start_table(res)
    lines += _streaming_table(res, ok)
    lines += _throughput_table(res, ok, plots)
    return "\n".join(lines)


def _stage_header(res: dict) -> list[str]:
    """Title, status, what was measured, notes."""
    st = res.get("stage", {})
    title = f"### {st.get('family', '?')} / {st.get('stage', '?')}"
    if st.get("dtype_override"):
        title += f" ({st['dtype_override']})"
    lines = [title, ""]
    if res.get("status") not in ("ok",):
        lines.append(f"**status: {res.get('status')}** {res.get('reason', '')}".rstrip())
        lines.append("")
    lines.append(
        f"kind `{st.get('kind')}`, dtype {st.get('dtype')}, preset {st.get('preset')}, buckets "
        f"{st.get('axes')}; {res.get('settings', {}).get('reps', '?')} timed calls per cell; commit "
        f"`{str(res.get('git_commit', '?'))[:12]}`; {res.get('started', '')}"
    )
    for note in res.get("notes", []):
        lines.append(f"\n_note: {note}_")
    lines.append("")
    return lines


def _latency_table(res: dict, ok: list[str], plots: dict[str, str]) -> list[str]:
    """Latency per bucket and variant (× floor), the variants not measured, the plot."""
    lines: list[str] = []
    variants = _variant_order(res)
    floors = res.get("floor", {})
    header = ["bucket", "floor ms (bound)"] + [
        f"`{v}`" + (f" [{res['variants'][v]['kernels']}]" if res["variants"][v].get("kernels") else "") for v in ok
    ]
    rows = []
    for b in res.get("buckets", []):
        k = b["key"]
        fl = floors.get(k, {})
        row = [f"`{k}`", f"{_fmt_ms(fl.get('ms'))} ({fl.get('bound', '?')})"]
        for v in ok:
            cell = res["variants"][v].get("buckets", {}).get(k)
            if not cell:
                row.append("—")
            else:
                x = f" ({cell['x_floor']:.1f}×)" if cell.get("x_floor") else ""
                row.append(f"{_fmt_ms(cell['ms'])}{x}")
        rows.append(row)
    if rows and ok:
        lines += ["Latency, ms (× floor):", "", _table(header, rows), ""]
    not_ok = [v for v in variants if res["variants"][v].get("status") != "ok"]
    if not_ok:
        lines.append(
            "Not measured: "
            + "; ".join(
                f"`{v}` {res['variants'][v].get('status')}: {res['variants'][v].get('reason', '')}" for v in not_ok
            )
        )
        lines.append("")
    if plots.get("latency"):
        lines += [f"![latency]({plots['latency']})", ""]
    return lines


def _parity_table(res: dict, ok: list[str]) -> list[str]:
    """Parity vs fp32, setup time and memory per variant."""
    lines: list[str] = []
    rows = []
    for v in ok:
        rec = res["variants"][v]
        errs = [
            b.get("rel_err_vs_fp32") for b in rec.get("buckets", {}).values() if b.get("rel_err_vs_fp32") is not None
        ]
        prep = [b.get("prepare_s", 0) for b in rec.get("buckets", {}).values()]
        mem = rec.get("memory", {})
        rows.append(
            [
                f"`{v}`",
                f"{max(errs):.2e}" if errs else "—",
                f"{rec.get('setup_s', 0) + sum(prep):.1f}",
                rec.get("weight_mib", "—"),
                mem.get("after_buckets_alloc_mib", "—"),
                mem.get("after_buckets_reserved_mib", "—"),
                mem.get("peak_reserved_mib", "—"),
            ]
        )
    if rows:
        lines += [
            "Parity, setup and memory:",
            "",
            _table(
                [
                    "variant",
                    "max rel err vs fp32",
                    "setup + prepare s",
                    "weights MiB",
                    "resident alloc MiB",
                    "resident reserved MiB",
                    "peak reserved MiB",
                ],
                rows,
            ),
            "",
        ]
    return lines


def _params_and_build(res: dict) -> list[str]:
    """Parameter counts through the passes; the artifact build."""
    lines: list[str] = []
    st = res.get("stage", {})
    p = res.get("params", {})
    if p:
        f, a, c = (
            p.get("faithful_fp32", {}),
            p.get("after_passes_fp32", {}),
            p.get("after_passes_compute_dtype", {}),
        )
        lines += [
            f"Parameters: faithful {f.get('params', '?'):,} ({f.get('mib', '?')} MiB fp32) → after passes "
            f"{a.get('params', '?'):,} ({a.get('mib', '?')} MiB fp32, {c.get('mib', '?')} MiB in "
            f"{st.get('dtype')}).",
            "",
        ]
    b = res.get("build")
    if b:
        lines += [
            f"Artifact build: {'cached' if b.get('cached') else str(b.get('seconds', '?')) + ' s'}"
            + (f" — error: {b['error']}" if b.get("error") else ""),
            "",
        ]
    return lines


def _cold_start_table(res: dict) -> list[str]:
    """Fresh process → first output, per path."""
    lines: list[str] = []
    cs = res.get("cold_start") or {}
    if cs:
        rows = []
        for mode, r in cs.items():
            if r.get("status") != "ok":
                rows.append([mode, "—", r.get("reason", r.get("status"))])
                continue
            parts = [
                f"{k.removesuffix('_s')} {r[k]:.2f} s"
                for k in ("startup_s", "module_s", "load_s", "compile_s")
                if k in r
            ]
            parts.append(f"first call {r.get('first_call_ms', 0):.1f} ms")
            if r.get("compile_mode"):
                parts.append(f"mode {r['compile_mode']}")
            rows.append([mode, f"{r['first_output_s']:.2f}", ", ".join(parts)])
        lines += [
            "Cold start (fresh process → first output):",
            "",
            _table(["path", "seconds", "breakdown"], rows),
            "",
        ]
    return lines


def _streaming_table(res: dict, ok: list[str]) -> list[str]:
    """Streaming one utterance, per variant (codec decoders)."""
    lines: list[str] = []
    rows = []
    for v in ok:
        s = res["variants"][v].get("streaming")
        if not s:
            continue
        if "ttfa_ms" in s:
            rows.append(
                [
                    f"`{v}`",
                    f"{s['ttfa_ms']:.1f}",
                    f"{s['total_ms']:.1f}",
                    f"{s['rtf']:.4f}",
                    f"{s['x_realtime']:.3g}×",
                ]
            )
        else:
            rows.append([f"`{v}`", "—", "—", "—", s.get("skipped", s.get("error", ""))])
    if rows:
        s0 = next(
            (res["variants"][v]["streaming"] for v in ok if "ttfa_ms" in res["variants"][v].get("streaming", {})),
            {},
        )
        lines += [
            f"Streaming a {s0.get('utterance_s', '?')} s utterance ({s0.get('chunks', '?')} chunks of "
            f"{s0.get('chunk_frames', '?')} frames, left context {s0.get('left_context_frames', '?')}):",
            "",
            _table(["variant", "TTFA ms", "total ms", "RTF", "speed"], rows),
            "",
        ]
    return lines


def _throughput_table(res: dict, ok: list[str], plots: dict[str, str]) -> list[str]:
    """Requests (audio seconds) per second vs batch."""
    lines: list[str] = []
    tv = [v for v in ok if res["variants"][v].get("throughput")]
    if tv:
        batches = sorted({r["batch"] for v in tv for r in res["variants"][v]["throughput"]})
        audio = any("audio_s_per_s" in r for v in tv for r in res["variants"][v]["throughput"])
        rows = []
        for bsz in batches:
            row = [bsz]
            for v in tv:
                r = next((r for r in res["variants"][v]["throughput"] if r["batch"] == bsz), {})
                if "items_per_s" not in r:
                    row.append(r.get("error", "—")[:60])
                elif audio and "audio_s_per_s" in r:
                    row.append(f"{r['items_per_s']:.1f} ({r['audio_s_per_s']:.0f} s/s)")
                else:
                    row.append(f"{r['items_per_s']:.1f}")
            rows.append(row)
        unit = "requests/s (audio seconds per second)" if audio else "requests/s"
        lines += [f"Throughput vs batch, {unit}:", "", _table(["batch"] + [f"`{v}`" for v in tv], rows), ""]
        if plots.get("throughput"):
            lines += [f"![throughput]({plots['throughput']})", ""]
    return lines


def serve_load_section(res: dict, plot_dir: Path | None, slug: str, output: Path) -> str:
    """`python -m examples.serve.load` (serve_load.json): the streaming service under c concurrent streams."""
    a, o, summ = res.get("artifact", {}), res.get("overhead", {}), res.get("summary", {})
    modes = res.get("modes", {})
    lines = ["### Streaming service under load", ""]
    lines += [
        f"`{a.get('family')}/{a.get('stage')}` ({a.get('dtype')}), {a.get('utterance_s', 0):.1f} s utterances "
        f"streamed in {a.get('chunk_frames')}-frame chunks (left context {a.get('left_context_frames')}), "
        f"batch buckets {sorted({b.get('batch') for b in a.get('buckets', [])})}; "
        f"{res.get('settings', {}).get('seconds')} s per cell over HTTP on 127.0.0.1; batched = max wait "
        f"{res.get('settings', {}).get('max_wait_ms')} ms, unbatched = the same server with batches of one; "
        f"commit `{str(res.get('git_commit', '?'))[:12]}`; {res.get('started', '')}",
        "",
    ]
    for m, rec in modes.items():
        if rec.get("status") != "ok":
            lines += [f"**{m}: {rec.get('status')}** {rec.get('reason', '')}".rstrip(), ""]
    cells = {m: {c["concurrency"]: c for c in rec.get("cells", []) if "audio_s_per_s" in c} for m, rec in modes.items()}
    conc = sorted({c for v in cells.values() for c in v})

    def cell(m: str, c: int, what: str) -> str:
        x = cells.get(m, {}).get(c)
        if not x:
            return "—"
        if what == "tput":
            return f"{x['audio_s_per_s']:.1f}"
        if what == "ttfa":
            return f"{_fmt_ms(x['ttfa_ms']['p50'])} / {_fmt_ms(x['ttfa_ms']['p95'])}"
        if what == "rtf":
            return f"{x['rtf']['p50']:.3g} / {x['rtf']['p95']:.3g}"
        return f"{x['mean_rows_per_call']:.1f}" if x.get("mean_rows_per_call") else "—"

    rows = []
    for c in conc:
        sp = summ.get("by_concurrency", {}).get(str(c), {}).get("audio_s_per_s_speedup")
        rows.append(
            [
                c,
                cell("batched", c, "tput"),
                cell("unbatched", c, "tput"),
                f"{sp:.2f}×" if sp else "—",
                cell("batched", c, "ttfa"),
                cell("unbatched", c, "ttfa"),
                cell("batched", c, "rtf"),
                cell("batched", c, "rows"),
            ]
        )
    if rows:
        lines += [
            "Audio seconds per second, TTFA p50 / p95 (ms), RTF p50 / p95 per request, rows per stage call:",
            "",
            _table(
                [
                    "streams",
                    "batched audio-s/s",
                    "unbatched audio-s/s",
                    "speed-up",
                    "batched TTFA",
                    "unbatched TTFA",
                    "batched RTF",
                    "rows/call",
                ],
                rows,
            ),
            "",
        ]
    if "overhead_pct" in o:
        lines += [
            f"Batcher overhead at c=1 ({o['frames']}-frame window, median of {o['reps']} interleaved calls): "
            f"{o['batcher_ms']['p50']:.3f} ms through the batcher vs {o['direct_ms']['p50']:.3f} ms direct "
            f"= {o['overhead_pct']:+.1f}%.",
            "",
        ]
    t, met = res.get("targets", {}), summ.get("targets_met", {})

    def verdict(k: str) -> str:
        return "—" if met.get(k) is None else ("**met**" if met[k] else "**not met**")

    lines += [
        f"Targets at c={t.get('concurrency')}: audio-s/s ≥ {t.get('audio_s_per_s_speedup_min')}× unbatched "
        f"{verdict('audio_s_per_s_speedup')}; TTFA p95 ≤ {t.get('ttfa_p95_ratio_max')}× c=1 "
        f"{verdict('ttfa_p95_ratio')}; batcher overhead ≤ {t.get('batcher_overhead_pct_max')}% "
        f"{verdict('batcher_overhead')}.",
        "",
    ]
    if plot_dir is not None and rows:
        try:
            lines += [f"![serve load]({os.path.relpath(_serve_plot(cells, plot_dir, slug, res), output.parent)})", ""]
        except Exception as e:  # noqa: BLE001
            lines += [f"_plot failed: {type(e).__name__}: {e}_", ""]
    return "\n".join(lines)


def _serve_plot(cells: dict, plot_dir: Path, slug: str, res: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, by_c in cells.items():
        cs = sorted(by_c)
        ax1.plot(cs, [by_c[c]["audio_s_per_s"] for c in cs], marker="o", label=mode)
        ax2.plot(cs, [by_c[c]["ttfa_ms"]["p95"] for c in cs], marker="o", label=mode)
    for ax, label in ((ax1, "audio seconds per second"), (ax2, "TTFA p95, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    a = res.get("artifact", {})
    fig.suptitle(f"{a.get('family')}/{a.get('stage')} streaming service — {res['device'].get('name')}")
    fig.tight_layout()
    plot_dir.mkdir(parents=True, exist_ok=True)
    path = plot_dir / f"{slug}__serve_load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hardware_rows(devices: dict) -> list[list[Any]]:
    rows = []
    for slug, d in devices.items():
        dev = d["device"]
        hw = next((r.get("hardware") for r in d["stages"] if r.get("hardware")), {}) or {}
        rows.append(
            [
                dev.get("name", slug),
                dev.get("torch"),
                dev.get("cuda"),
                dev.get("triton"),
                dev.get("driver", "—"),
                hw.get("copy", {}).get("gb_per_s", "—"),
                hw.get("matmul", {}).get("tflop_per_s", "—"),
            ]
        )
    return rows


def _snake_section(snake: dict) -> str:
    rows = []
    for dt, c in snake.get("cases", {}).items():
        k = c.get("kernel", {})
        e = c.get("eager", {})
        rows.append(
            [
                dt,
                f"{c.get('copy', {}).get('gb_per_s', 0):.0f}",
                f"{e.get('gb_per_s', 0):.0f} ({e.get('ratio_to_copy', 0):.0%})" if e else "—",
                f"{k['gb_per_s']:.0f} ({k['ratio_to_copy']:.0%})" if "gb_per_s" in k else k.get("status", "—"),
                ("yes" if k.get("meets_target") else "no") if "gb_per_s" in k else "—",
            ]
        )
    return "\n".join(
        [
            f"SnakeBeta `{snake.get('shape')}`, GB/s counting bytes read + written (% of a D2D copy of "
            f"the same bytes; target ≥ {snake.get('target_ratio', 0.85):.0%}):",
            "",
            _table(["dtype", "copy", "eager formula", "Triton kernel", "≥ target"], rows),
            "",
        ]
    )


def make_plots(res: dict, plot_dir: Path, slug: str) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st = res.get("stage", {})
    base = f"{slug}__{st.get('family')}__{st.get('stage')}"
    if st.get("dtype_override"):
        base += f"__{st['dtype_override']}"
    out: dict[str, Path] = {}
    ok = [v for v in _variant_order(res) if res["variants"][v].get("buckets")]
    keys = [b["key"] for b in res.get("buckets", [])]
    if ok and keys:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys) * max(1, len(ok)) / 3), 4))
        width = 0.8 / (len(ok) + 1)
        for i, v in enumerate(ok):
            ms = [res["variants"][v].get("buckets", {}).get(k, {}).get("ms", float("nan")) for k in keys]
            ax.bar([j + i * width for j in range(len(keys))], ms, width, label=v)
        fl = [res.get("floor", {}).get(k, {}).get("ms", float("nan")) for k in keys]
        ax.bar([j + len(ok) * width for j in range(len(keys))], fl, width, label="floor", color="black")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys)
        ax.set_ylabel("ms (median)")
        ax.set_yscale("log")
        ax.set_title(f"{st.get('family')}/{st.get('stage')} latency per bucket — {res['device'].get('name')}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out["latency"] = plot_dir / f"{base}__latency.png"
        fig.savefig(out["latency"], dpi=110)
        plt.close(fig)
    tv = [v for v in ok if res["variants"][v].get("throughput")]
    if tv:
        fig, ax = plt.subplots(figsize=(6, 4))
        for v in tv:
            pts = [(r["batch"], r["items_per_s"]) for r in res["variants"][v]["throughput"] if "items_per_s" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("requests / s")
        ax.set_title(f"{st.get('family')}/{st.get('stage')} throughput — {res['device'].get('name')}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        out["throughput"] = plot_dir / f"{base}__throughput.png"
        fig.savefig(out["throughput"], dpi=110)
        plt.close(fig)
    return out


def write_report(results: Path, output: Path, plot_dir: Path | None = None, include_cpu: bool = False) -> Path:
    devices = load_results(results, include_cpu)
    plot_dir = plot_dir or results / "plots"
    try:
        import matplotlib  # noqa: F401

        have_mpl = True
    except Exception:  # noqa: BLE001
        have_mpl = False
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench report` from `bench/results/<device>/*.json` (measured with "
        "`make bench` / `bench/gpu_all.sh` on a GPU machine). Do not edit by hand.",
        "",
    ]
    if not devices:
        parts += [
            "**No GPU results yet.** Run `bash bench/gpu_all.sh` (or `make bench`) on a CUDA machine, commit "
            "`bench/results/`, then `python -m bench report`."
            + ("" if not include_cpu else " (CPU results were requested but none were found.)"),
            "",
        ]
    else:
        cpu = [s for s, d in devices.items() if d["device"].get("type") != "cuda"]
        if cpu and include_cpu:
            parts += [
                f"**Includes CPU smoke-test results ({', '.join(cpu)}): tiny presets, not publishable.**",
                "",
            ]
        elif cpu:
            parts += [f"CPU sections ({', '.join(cpu)}): build time and cold start only (tiny presets).", ""]
        parts += [
            "## Machines",
            "",
            _table(
                ["device", "torch", "CUDA", "Triton", "driver", "copy GB/s (r+w)", "matmul TFLOP/s"],
                _hardware_rows(devices),
            ),
            "",
        ]
    if not have_mpl:
        parts += ["_Plots not generated: matplotlib is not importable where the report was written._", ""]
    for slug, d in devices.items():
        parts += [f"## {d['device'].get('name', slug)}", ""]
        if d["snake"]:
            parts += [_snake_section(d["snake"]), ""]
        for res in d.get("kernels", []):
            from .kernels import summary

            parts += [
                f"Kernel layer (`python -m bench kernels`; figures in `{res['_file']}`):",
                "",
                "```text",
                summary(res),
                "```",
                "",
            ]
        if d.get("profiles"):
            parts += [profiles_section(d["profiles"]), ""]
            shapes = launch_shapes_section(d["profiles"])
            parts += [shapes, ""] if shapes else []
        for res in d.get("builds", []):
            from .build_times import summary as builds_summary

            parts += [builds_summary(res), ""]
        for res in d.get("conv_kernels", []):
            rows = [
                [
                    f"`{k}`",
                    str(v.get("layers", "—")),
                    f"{v['cudnn_ms']:.3f}",
                    f"{v['kernel_ms']:.3f}",
                    f"{v['fused_ms']:.3f}",
                    f"{v['cudnn_ms'] / v['fused_ms']:.2f}×",
                ]
                for k, v in (res.get("summary") or {}).items()
                if v.get("fused_ms")
            ]
            if rows:
                parts += [
                    f"Channels-last conv kernels per codec, all conv layers of one call (`python -m bench "
                    f"conv-kernels`, `{res['_file']}`; ms; cuDNN = eager NCL convs, kernels = each layer alone, "
                    f"fused = the fused chain in one CUDA graph):",
                    "",
                    _table(["stage:batch:precision", "layers", "cuDNN", "kernels", "fused", "speed-up"], rows),
                    "",
                ]
        for res in d.get("decode_stages", []):
            parts += [decode_stages_section(res), ""]
        for res in d.get("codec_stages", []):
            from .codec_stages import summary_lines

            tasks = ", ".join(t.get("task", "?") for t in res.get("tasks", []))
            mode = res.get("compile_mode") if "compile" in res.get("variants", []) else None
            parts += [
                f"Codec stages, kernels=ttsaot vs kernels=inductor (`python -m bench codec-stages`; {tasks}; "
                f"commit `{str(res.get('commit', ''))[:12]}`; ms: graph replay of the artifacts, per call for "
                "eager = the stage module in its precision, eager_tf32 = the same with TF32, eager_default = the "
                "faithful fp32 module under PyTorch's default flags (the upstream eager path)"
                + (f", compile_graph = torch.compile mode {mode} replayed in a manual CUDA graph" if mode else "")
                + "):",
                "",
                "```text",
                *summary_lines(res),
                "```",
                "",
            ]
        if d.get("memory"):
            from .memory import report_section

            parts += [report_section(d["memory"]), ""]
        for res in sorted(
            d["stages"],
            key=lambda r: (r.get("stage", {}).get("family", ""), r.get("stage", {}).get("stage", "")),
        ):
            plots: dict[str, str] = {}
            if have_mpl and res.get("variants"):
                plot_dir.mkdir(parents=True, exist_ok=True)
                try:
                    for k, p in make_plots(res, plot_dir, slug).items():
                        plots[k] = os.path.relpath(p, output.parent)
                except Exception as e:  # noqa: BLE001
                    parts.append(f"_plot failed: {type(e).__name__}: {e}_")
            if res.get("kind") == "serve_load":
                parts += [serve_load_section(res, plot_dir if have_mpl else None, slug, output), ""]
                continue
            render = result_sections().get(res.get("kind"))  # a family's own result kind (bench/families/)
            parts += [render(res, d["stages"]) if render else _stage_section(res, plots), ""]
    parts += [HOW_TO_READ]
    output.write_text("\n".join(parts).rstrip() + "\n")
    return output
