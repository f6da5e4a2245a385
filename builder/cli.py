"""`build-artifacts`: build · inspect · verify · list."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import replace

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Tables are read in CI logs and by tests too: never squeeze them below 160 columns.
_WIDTH = max(shutil.get_terminal_size((160, 24)).columns, 160)
console = Console(stderr=True, width=_WIDTH)
out_console = Console(width=_WIDTH)

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32",
          "fp16": "float16", "float16": "float16"}


def _quiet_torch_warnings() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")


def _int_list(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if any(v <= 0 for v in out):
        raise click.BadParameter("sizes must be positive")
    return out


def _float_list(value: str | None) -> tuple[float, ...] | None:
    if not value:
        return None
    try:
        out = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None
    if any(v <= 0 for v in out):
        raise click.BadParameter("values must be positive")
    return out


class _RichReporter:
    def __init__(self, progress: Progress) -> None:
        self.progress, self.tasks = progress, {}

    def stage_start(self, stage: str, n: int) -> None:
        self.tasks[stage] = self.progress.add_task(f"compile {stage}", total=n)

    def bucket_done(self, stage: str, key: str, seconds: float) -> None:
        self.progress.update(self.tasks[stage], advance=1, description=f"compile {stage} ({key} {seconds:.0f}s)")

    def note(self, msg: str) -> None:
        self.progress.console.print(f"[dim]{msg}[/dim]")


def _fail(e: BaseException, debug: bool) -> None:
    if debug:
        raise e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    console.print(f"[bold red]error:[/bold red] {msg}", highlight=False, soft_wrap=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Build, inspect and verify ahead-of-time compiled TTS stage artifacts."""
    ctx.obj = {"debug": debug}
    _quiet_torch_warnings()


@main.command()
@click.argument("family")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), help="Real checkpoint directory.")
@click.option("--preset", default=None, help="Named config preset (tiny, full) for --random-weights builds.")
@click.option("--random-weights", is_flag=True, help="Deterministic random weights (no checkpoint needed).")
@click.option("--stages", default=None, help="Comma-separated stage names (default: all of the family).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N]: where the artifact will run.")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default=None, help="Compute dtype (stage default).")
@click.option("--max-batch", type=int, default=None, help="Largest batch bucket (powers of two up to it).")
@click.option("--batch-buckets", default=None, help="Explicit batch buckets, e.g. 1,4.")
@click.option("--frame-buckets", default=None, help="Explicit frame buckets instead of the streaming plan.")
@click.option("--chunk-frames", type=int, default=None, help="Streaming: new frames per chunk.")
@click.option("--left-context-frames", type=int, default=None, help="Streaming: frames of left context.")
@click.option("--first-chunk-frames", type=int, default=None, help="Streaming: initial chunk size (0 = off).")
@click.option("--nonstreaming-chunk-frames", type=int, default=None, help="Chunk for one-shot long decode (0 = off).")
@click.option("--no-pow2", is_flag=True, help="Do not add power-of-two frame buckets.")
@click.option("--max-len", type=int, default=None, help="LM stages: static KV cache length (voxcpm2).")
@click.option("--prefill-buckets", default=None, help="LM prefill prompt-length buckets, e.g. 64,128,256,512.")
@click.option("--encoder-seconds", default=None, help="DAC encoder length buckets in seconds, e.g. 5,10,15,30.")
@click.option("--talker-size", type=click.Choice(["0.6B", "1.7B"]), default=None,
              help="qwen3-tts-12hz code_predictor config for --preset full.")
@click.option("--with-embedding", is_flag=True, help="Predictor stages also output the next backbone input embedding.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out_dir", default="artifacts", show_default=True, type=click.Path(file_okay=False))
@click.option("--cxx", default=None, help="C++ compiler for AOTInductor (sets $CXX; /usr/bin/g++ on the GPU box).")
# Opt-in, not a default: never timed as an artifact. torch.compile with max-autotune ran the VoxCPM2 residual step
# at B=1 in 0.428 ms against 0.647 ms for the default-compiled artifact (H200), and autotuning the base step's build
# took 350 s instead of 116 s (bench/results/nvidia-h200/probes/README.md).
@click.option("--max-autotune", is_flag=True, help="Inductor max-autotune for the compiled kernels (slower build).")
@click.option("--tf32", is_flag=True,
              help="fp32 stages (not the fp32-by-policy encoder/VAE) run TF32 convolutions/matmuls on CUDA, as "
                   "PyTorch's defaults give the reference: ~2-3x faster, ~1e-3 relative error.")
@click.option("--no-verify", is_flag=True, help="Skip loading the fresh packages in a subprocess (not advised).")
@click.option("--format", "formats", default="aoti", show_default=True,
              help="aoti (AOTInductor package per bucket), onnx (one ONNX model per stage, dynamic axes), or "
                   "aoti,onnx.")
@click.pass_context
def build(ctx, family, checkpoint, preset, random_weights, stages, device, dtype, max_batch, batch_buckets,
          frame_buckets, chunk_frames, left_context_frames, first_chunk_frames, nonstreaming_chunk_frames, no_pow2,
          max_len, prefill_buckets, encoder_seconds, talker_size, with_embedding, seed, out_dir, cxx, max_autotune,
          tf32, no_verify, formats):
    """Build FAMILY's stages into OUT/FAMILY (atomically: the old artifact stays until the new one is verified)."""
    debug = ctx.obj["debug"]
    try:
        import torch

        from .build import BuildError, build_family, parse_formats, stage_summary
        from .families import get_family

        try:
            formats = parse_formats(formats)
        except BuildError as e:
            raise click.UsageError(str(e)) from None

        if cxx:
            os.environ["CXX"] = cxx
        if bool(checkpoint) == bool(random_weights):
            raise click.UsageError("give exactly one of --checkpoint DIR or --random-weights (with --preset)")
        fam = get_family(family)
        if preset is not None and preset not in fam.PRESETS:
            raise click.UsageError(f"unknown preset {preset!r} for {family} (have: {', '.join(fam.PRESETS)})")
        kw = dict(checkpoint=checkpoint, preset=preset or "tiny", seed=seed, max_batch=max_batch,
                  batch_buckets=_int_list(batch_buckets), frame_buckets=_int_list(frame_buckets),
                  pow2_frames=not no_pow2 if no_pow2 else None,
                  dtype=getattr(torch, DTYPES[dtype]) if dtype else None,
                  max_len=max_len, prefill_buckets=_int_list(prefill_buckets), talker_size=talker_size,
                  encoder_seconds=_float_list(encoder_seconds),
                  fast_ar_with_embedding=True if with_embedding else None,
                  code_predictor_with_embedding=True if with_embedding else None)
        defaults = getattr(fam, "STREAMING_DEFAULTS", None)
        if defaults is not None and any(v is not None for v in (chunk_frames, left_context_frames,
                                                                 first_chunk_frames, nonstreaming_chunk_frames)):
            kw["streaming"] = replace(defaults, **{k: v for k, v in dict(
                chunk_frames=chunk_frames, left_context_frames=left_context_frames,
                first_chunk_frames=first_chunk_frames,
                nonstreaming_chunk_frames=nonstreaming_chunk_frames).items() if v is not None})
        opts = fam.options_from_cli(**kw)
        specs = fam.stages(opts)
        if stages:
            want = stages.split(",")
            unknown = [s for s in want if s not in {sp.name for sp in specs}]
            if unknown:
                raise click.UsageError(f"unknown stage {unknown[0]!r} for {family} "
                                       f"(have: {', '.join(sp.name for sp in specs)})")
            specs = [sp for sp in specs if sp.name in want]
        if tf32:
            from .stage_spec import with_tf32

            specs = [with_tf32(sp) for sp in specs]
        extra = {"max_autotune": True} if max_autotune else None
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            result = build_family(family, specs, out_dir, device=device, seed=seed,
                                  preset=None if checkpoint else (preset or "tiny"),
                                  reporter=_RichReporter(progress), verify_in_subprocess=not no_verify,
                                  extra_inductor_options=extra, formats=formats)
        table = Table(title=f"{family} → {result.path} ({result.seconds:.0f}s)")
        cols = ("stage", "buckets", "dtype", "weights_mib", "package_mib") + (("onnx_mib",) if "onnx" in formats
                                                                              else ())
        for col in cols:
            table.add_column(col)
        for row in stage_summary(result):
            table.add_row(*(str(row.get(c, "-")) for c in cols))
        out_console.print(table)
    except click.UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - one line per failure unless --debug
        _fail(e, debug)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: the previous artifact (if any) is unchanged")
        sys.exit(130)


def _load_manifest_json(path: str) -> dict:
    from ..runtime.artifact import read_manifest

    return json.loads(read_manifest(path).to_json())


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@click.pass_context
def inspect(ctx, artifact, as_json):
    """Show an artifact: build environment, stages, buckets, sizes, what pruning kept and dropped."""
    try:
        m = _load_manifest_json(artifact)
        rows = []
        for name, st in m["stages"].items():
            ck = st.get("checkpoint", {})
            dropped = {}
            for p in st.get("passes", []):
                for k, v in (p.get("dropped") or {}).items():
                    dropped[k] = v
            for k, n in (ck.get("dropped") or {}).items():
                dropped[k] = {"params": n}
            rows.append({
                "stage": name, "kind": st["kind"], "dtype": st["dtype"],
                "buckets": [b["key"] for b in st["buckets"]],
                "weights_mib": round(st["weights"]["bytes"] / 2**20, 3) if st.get("weights") else 0.0,
                "packages_mib": round(sum(b["bytes"] for b in st["buckets"]) / 2**20, 3),
                "params_before": ck.get("params_before"), "params_after": ck.get("params_after"),
                "dropped": dropped, "ignored": ck.get("ignored"), "tolerance": st["tolerance"],
                "onnx": st.get("onnx"),
                # how it was compiled and which numerics it runs: autotuned GEMMs, TF32 allowed (build --tf32)
                "inductor_options": st.get("inductor_options", {}),
                "tf32": bool(st.get("metadata", {}).get("allow_tf32", False)),
            })
        if as_json:
            out_console.print_json(json.dumps({"family": m["family"], "device": m["device"], "preset": m["preset"],
                                               "build_env": m["build_env"], "stages": rows}))
            return
        env = m["build_env"]
        out_console.print(f"[bold]{m['family']}[/bold] format v{m['format_version']} device={m['device']} "
                          f"preset={m['preset']} torch={env.get('torch')} triton={env.get('triton')} "
                          f"cuda={env.get('cuda')} gpu={env.get('gpu_name', '-')} sm={env.get('sm', '-')} "
                          f"cxx={env.get('cxx_version', '?')}", highlight=False)
        t = Table()
        for c in ("stage", "kind", "dtype", "buckets", "weights MiB", "packages MiB", "params kept",
                  "params dropped", "compiled with", "onnx"):
            t.add_column(c)
        for r in rows:
            kept = r["params_after"] or {}
            before = r["params_before"] or {}
            dropped_params = sum(int(v.get("params", 0)) for v in r["dropped"].values())
            t.add_row(r["stage"], r["kind"], r["dtype"], f"{len(r['buckets'])}: {' '.join(r['buckets'])}",
                      f"{r['weights_mib']}", f"{r['packages_mib']}",
                      f"{kept.get('params', '?')} ({kept.get('mib', '?')} MiB)",
                      f"{dropped_params} (of {before.get('params', '?')} loaded)",
                      " ".join([*(f"{k}={v}" for k, v in r["inductor_options"].items()), *(["tf32"] if r["tf32"]
                                                                                           else [])]) or "-",
                      _onnx_cell(r["onnx"]))
        out_console.print(t)
    except Exception as e:  # noqa: BLE001
        _fail(e, ctx.obj["debug"])


def _onnx_cell(onnx: dict | None) -> str:
    """`file (opset N, X MiB[, +data Y MiB]) dyn: batch 1-4, frames 1-48`"""
    if not onnx:
        return "-"
    ext = sum(x["bytes"] for x in onnx.get("external_data", []))
    size = f"{onnx['bytes'] / 2**20:.2f} MiB" + (f" + data {ext / 2**20:.2f} MiB" if ext else "")
    dyn = ", ".join(f"{a} {r['min']}-{r['max']}" for a, r in onnx.get("dynamic_axes", {}).items())
    static = ", ".join(f"{a}={n}" for a, n in onnx.get("static_axes", {}).items())
    return (f"{onnx['file']} (opset {onnx['opset']}, {size}) dynamic: {dyn or '-'}"
            + (f"; static: {static}" if static else ""))


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--device", default=None, help="Device to verify on (default: the artifact's).")
@click.option("--stages", default=None, help="Comma-separated subset of stages.")
@click.option("--no-graphs", is_flag=True, help="Run packages directly instead of replaying CUDA graphs.")
@click.option("--onnx/--no-onnx", "check_onnx", default=True, show_default=True,
              help="Also run the stages' ONNX models (when present) with onnxruntime against the golden cases.")
@click.pass_context
def verify(ctx, artifact, device, stages, no_graphs, check_onnx):
    """Re-run the golden cases through the runtime (and onnxruntime for ONNX models); exit 1 on any regression."""
    try:
        from ..runtime import load
        from ..runtime.artifact import read_manifest
        from ..runtime.verify import verify_bundle

        t0 = time.time()
        want = stages.split(",") if stages else None
        manifest = read_manifest(artifact)
        selected = [n for n in manifest.stages if want is None or n in want]
        aoti = [n for n in selected if manifest.stages[n].buckets]
        results, where = [], manifest.device
        if aoti or not check_onnx:
            bundle = load(artifact, device=device, stages=aoti if want or len(aoti) < len(selected) else None,
                          cuda_graphs=not no_graphs)
            results = verify_bundle(bundle, aoti)
            where = str(bundle.device)
        onnx_results = []
        if check_onnx and any(manifest.stages[n].onnx is not None for n in selected):
            from .onnx_verify import verify_onnx

            onnx_results = verify_onnx(artifact, selected)
        t = Table(title=f"verify {artifact} on {where} ({time.time() - t0:.1f}s)")
        for c in ("stage", "case", "output", "format", "metric", "value", "limit", "ok"):
            t.add_column(c)
        for r in results:
            t.add_row(r.stage, r.case, r.output, "aoti", r.metric, f"{r.value:.3g}", f"{r.limit:.3g}",
                      "[green]ok[/green]" if r.ok else "[red]FAIL[/red]")
        for r in onnx_results:
            state = (f"[yellow]skipped[/yellow] {r.skipped[:80]}" if r.skipped
                     else "[green]ok[/green]" if r.ok else "[red]FAIL[/red]")
            t.add_row(r.stage, r.case, r.output, f"onnx {r.provider.removesuffix('ExecutionProvider')}", r.metric,
                      f"{r.value:.3g}", f"{r.limit:.3g}", state)
        out_console.print(t)
        ran = list(results) + [r for r in onnx_results if not r.skipped]
        if not ran:
            why = f" (onnxruntime could not run the ONNX models: {onnx_results[0].skipped})" if onnx_results else ""
            raise RuntimeError(f"no golden cases to verify{why}")
        if not all(r.ok for r in ran):
            bad = next(r for r in ran if not r.ok)
            console.print(f"[bold red]regression:[/bold red] {bad.stage}/{bad.case}/{bad.output} "
                          f"{bad.metric}={bad.value:.3g} > {bad.limit:.3g}")
            sys.exit(1)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        _fail(e, ctx.obj["debug"])


@main.command(name="list")
def list_cmd():
    """List families, their stages and presets."""
    from .families import FAMILIES, get_family

    t = Table()
    for c in ("family", "stages", "presets"):
        t.add_column(c)
    for name in FAMILIES:
        try:
            fam = get_family(name)
            t.add_row(name, ", ".join(fam.STAGE_NAMES), ", ".join(fam.PRESETS))
        except ImportError as e:   # a family whose modules are not installed in this checkout
            t.add_row(name, f"(unavailable: {e})", "")
    out_console.print(t)


if __name__ == "__main__":
    main()
