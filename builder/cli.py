"""`build-artifacts`: build · inspect · verify · cache info / prune · list.

The arguments are checked before torch is imported (that takes seconds): `--help`, `list` and every usage error
answer at once, from the families' torch-free declarations (builder/options.py). Usage errors exit 2, failures 1.
`build`'s family flags are the registered families' own (each family's options dataclass declares them); a flag
the chosen family does not declare is a usage error naming the family's flags."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import click

from ..runtime.dtypes import DTYPE_ALIASES, torch_dtype
from .families import FAMILIES, get_family
from .family import Family
from .options import DYNAMIC_PACKAGES, Flag, OptionsError, positive_ints, with_flags

# = build.FORMATS (tests/test_cli.py checks they agree); named here so a wrong --format fails before torch loads.
ARTIFACT_FORMATS = ("aoti", "onnx")
EMPTY = "-"  # the one marker for an empty value in tables
# Tables are read in CI logs and by tests too: never squeeze them below 160 columns.
MIN_WIDTH = 160
EXIT_FAILURE, EXIT_INTERRUPTED = 1, 130


@cache
def _consoles():
    from rich.console import Console

    width = max(shutil.get_terminal_size((MIN_WIDTH, 24)).columns, MIN_WIDTH)
    return Console(stderr=True, width=width), Console(width=width)


def _err_console():
    return _consoles()[0]


def _out_console():
    return _consoles()[1]


def _quiet_torch_warnings() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")


def _hint(msg: str) -> str:
    """What to do about a failure, where the message alone does not say."""
    if "differs from eager" in msg:  # the build's golden check (builder/build.py subprocess_verify)
        return (
            "the compiled artifact disagrees with its eager reference beyond the stage's tolerance. Rebuild with "
            "--dtype fp32 (exact numerics), or --no-verify to keep it unchecked (not advised); --debug shows "
            "the traceback"
        )
    return ""


def _fail(e: BaseException, debug: bool) -> None:
    if debug:
        raise e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    console = _err_console()
    console.print(f"[bold red]error:[/bold red] {msg}", highlight=False, soft_wrap=True)
    hint = _hint(msg)
    if hint:
        console.print(f"[yellow]hint:[/yellow] {hint}", highlight=False, soft_wrap=True)
    sys.exit(EXIT_FAILURE)


def _debug_option(f):
    return click.option(
        "--debug",
        "debug_here",
        is_flag=True,
        help="Show tracebacks instead of one-line errors (also accepted before the command).",
    )(f)


def _debug(ctx: click.Context, here: bool) -> bool:
    return here or bool((ctx.obj or {}).get("debug"))


# ------------------------------------------------------------------------------------------- family flags
def _param_name(flag_name: str) -> str:
    return "family_" + flag_name.lstrip("-").replace("-", "_")


def _default_at(options: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        options = getattr(options, name)
    return options


def _show(value: Any) -> str:
    if value is None:
        return EMPTY
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value)
    return str(value)


def _family_flags() -> dict[str, list[tuple[Family, Flag]]]:
    """flag name → the families declaring it (one CLI option per name, whatever family declares it)."""
    out: dict[str, list[tuple[Family, Flag]]] = {}
    for name in FAMILIES:
        fam = get_family(name)
        for fl in fam.flags:
            out.setdefault(fl.name, []).append((fam, fl))
    for name, owners in out.items():
        if len({fl.is_switch for _, fl in owners}) > 1:
            raise TypeError(f"flag {name} is a switch for some families and takes a value for others")
    return out


def _family_params() -> list[click.Option]:
    params = []
    for name, owners in _family_flags().items():
        fl = owners[0][1]
        helps = dict.fromkeys(f.help for _, f in owners)
        text = fl.help if len(helps) == 1 else " ".join(f"{fam.name}: {f.help}" for fam, f in owners)
        defaults = {fam.name: _default_at(fam.Options(), f.path) for fam, f in owners}
        if fl.is_switch or all(v is None for v in defaults.values()):
            what = f"[{', '.join(defaults)}]"
        else:
            what = "[default " + "; ".join(f"{fam}: {_show(v)}" for fam, v in defaults.items()) + "]"
        choices = getattr(fl.parse, "choices", None)
        metavar = fl.metavar or ("|".join(choices) if choices else "N")
        if fl.is_switch:
            params.append(click.Option([name, _param_name(name)], is_flag=True, default=False, help=f"{text} {what}"))
        else:
            params.append(click.Option([name, _param_name(name)], default=None, metavar=metavar, help=f"{text} {what}"))
    return params


class _BuildCommand(click.Command):
    """`build`: the generic options plus every registered family's flags (read when the command line is parsed,
    so a family registered with `register_family` gets its flags too)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)  # the help option comes last
        return params[:-1] + _family_params() + params[-1:]


def _family_options(fam: Family, values: dict[str, Any], base: dict[str, Any]):
    """The family's options from the generic values and the given family flags; usage errors name the flag."""
    declared = {fl.name: fl for fl in fam.flags}
    by_param = {_param_name(n): n for n in _family_flags()}
    given: dict[str, Any] = {}
    opts = fam.options(**base)
    for param, raw in values.items():
        name = by_param[param]
        if raw is None or raw is False:
            continue
        if name not in declared:
            have = ", ".join(declared) or "none"
            raise click.UsageError(f"{name} is not an option of {fam.name} (its options: {have})")
        fl = declared[name]
        if fl.is_switch:
            given[name] = not _default_at(opts, fl.path)
        else:
            try:
                given[name] = fl.parse(raw)
            except ValueError as e:
                raise click.UsageError(f"{name}: {e}") from None
    opts = with_flags(opts, given)
    fam.check(opts)
    return opts


def _int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return positive_ints(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _formats(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    items = [f.strip().lower() for f in value.split(",") if f.strip()]
    bad = [f for f in items if f not in ARTIFACT_FORMATS]
    if bad or not items:
        raise click.BadParameter(
            f"unknown artifact format {bad[0] if bad else value!r} (have: {', '.join(ARTIFACT_FORMATS)})"
        )
    return tuple(f for f in ARTIFACT_FORMATS if f in items)


def _cache_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--cache-max-size → bytes (None: unbounded); unset → $TTSAOT_CACHE_MAX_SIZE, else the default bound."""
    from .cache_prune import CacheSizeError, default_max_bytes, parse_size

    try:
        return default_max_bytes() if value is None else parse_size(value)
    except CacheSizeError as e:
        raise click.BadParameter(str(e)) from None


class _RichReporter:
    def __init__(self, progress) -> None:
        self.progress, self.tasks = progress, {}
        self.t0 = time.monotonic()

    def stage_start(self, stage: str, n: int) -> None:
        self.tasks[stage] = self.progress.add_task(f"compile {stage}", total=n)

    def bucket_done(self, stage: str, key: str, seconds: float) -> None:
        self.progress.update(self.tasks[stage], advance=1, description=f"compile {stage} ({key} {seconds:.0f}s)")
        if not self.progress.console.is_terminal:  # a log (CI, `bench builds`) gets one line per package instead
            self.progress.console.print(
                f"[{time.monotonic() - self.t0:7.1f}s] {stage}/{key} compiled ({seconds:.0f}s)", highlight=False
            )

    def note(self, msg: str) -> None:
        self.progress.console.print(f"[dim]{msg}[/dim]")


# ----------------------------------------------------------------------------------------------- commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Build, inspect and verify ahead-of-time compiled TTS stage artifacts."""
    ctx.obj = {"debug": debug}
    _quiet_torch_warnings()


@main.command(cls=_BuildCommand)
@click.argument("family")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False),
    help="Real checkpoint directory (the family's layout: README § Checkpoints).",
)
@click.option("--random-weights", is_flag=True, help="Deterministic random weights of --preset (no checkpoint).")
@click.option(
    "--preset", default=None, show_default="tiny", help="Named config (tiny, full) of --random-weights builds."
)
@click.option("--stages", default=None, help="Comma-separated stage names [default: all the checkpoint holds].")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N]: where the artifact will run.")
@click.option(
    "--dtype",
    type=click.Choice(sorted(DTYPE_ALIASES)),
    default=None,
    help="Compute dtype [default: each stage's own, README § Numerics].",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Largest batch bucket (powers of two up to it, and it).",
)
@click.option(
    "--batch-buckets", default=None, callback=_int_list, metavar="N,N", help="Explicit batch buckets instead, e.g. 1,4."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random weights and golden inputs.")
@click.option(
    "--out",
    "out_dir",
    default="artifacts",
    show_default=True,
    type=click.Path(file_okay=False),
    help="The artifact goes to OUT/FAMILY.",
)
@click.option("--cxx", default=None, help="C++ compiler for AOTInductor (sets $CXX; /usr/bin/g++ on the GPU box).")
# Opt-in, not a default: never timed as an artifact. torch.compile with max-autotune ran the VoxCPM2 residual step
# at B=1 in 0.428 ms against 0.647 ms for the default-compiled artifact (H200), and autotuning the base step's build
# took 350 s instead of 116 s (bench/results/nvidia-h200/probes/README.md).
@click.option("--max-autotune", is_flag=True, help="Inductor max-autotune for the compiled kernels (slower build).")
@click.option(
    "--tf32",
    is_flag=True,
    help="fp32 stages (not the fp32-by-policy encoder/VAE) run TF32 convolutions/matmuls on CUDA, as "
    "PyTorch's defaults give the reference: ~2-3x faster, ~1e-3 relative error.",
)
@click.option(
    "--kernels",
    type=click.Choice(["auto", "ttsaot", "inductor"]),
    default="auto",
    show_default=True,
    help="Hot paths from the ttsaot Triton kernel layer, or Inductor's own code; auto = ttsaot on CUDA "
    "for the stages whose kernels are GPU-verified (the codecs, bf16 VoxCPM2 LM steps: README), inductor "
    "elsewhere and on CPU (where the kernels would only run their aten references).",
)
@click.option(
    "--dynamic-packages",
    type=click.Choice(list(DYNAMIC_PACKAGES)),
    default="auto",
    show_default=True,
    help="One AOTI package per stage with the bucket axes dynamic, serving every bucket (on), one static "
    "package per bucket (off), or static ones for the windows every chunk of a stream hits and dynamic ones for "
    "the rest (cold); auto = on for CPU builds, off on CUDA (kernels autotuned per shape).",
)
@click.option("--no-verify", is_flag=True, help="Skip loading the fresh packages in a subprocess (not advised).")
@click.option(
    "--format",
    "formats",
    default="aoti",
    show_default=True,
    callback=_formats,
    help="aoti (AOTInductor packages: per bucket, or dynamic ones serving many, see --dynamic-packages), onnx (one "
    "ONNX model per stage, dynamic axes), or aoti,onnx.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    show_default="$TTSAOT_CACHE_DIR or $XDG_CACHE_HOME/ttsaot/packages",
    help="Package cache: a rebuild reuses every package whose program, bucket, kernels and toolchain did not change.",
)
@click.option("--no-cache", is_flag=True, help="Compile every package (the cache is neither read nor written).")
@click.option(
    "--cache-max-size",
    "cache_max_bytes",
    default=None,
    callback=_cache_size,
    show_default="$TTSAOT_CACHE_MAX_SIZE or 20GB",
    help="After the build, remove the cache's least recently used entries down to this size (20GB, 512MiB, off); "
    "never one this build used.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    show_default="min(cores, memory / 4 GiB)",
    help="AOTI compiles in this many worker processes (the packages of all stages side by side; on CUDA while the "
    "prepared stages fit in a quarter of the GPU memory).",
)
@_debug_option
@click.pass_context
def build(
    ctx,
    family,
    checkpoint,
    random_weights,
    preset,
    stages,
    device,
    dtype,
    max_batch,
    batch_buckets,
    seed,
    out_dir,
    cxx,
    max_autotune,
    tf32,
    kernels,
    dynamic_packages,
    no_verify,
    formats,
    cache_dir,
    no_cache,
    cache_max_bytes,
    jobs,
    debug_here,
    **family_flags,
):
    """Build FAMILY's stages into OUT/FAMILY (atomically: the old artifact stays until the new one is verified).

    The flags after --format belong to the families named in brackets; `build-artifacts list` shows each
    family's."""
    debug = _debug(ctx, debug_here)
    # ---- arguments (no torch yet)
    if bool(checkpoint) == bool(random_weights):
        raise click.UsageError("give exactly one of --checkpoint DIR or --random-weights (with --preset)")
    try:
        fam = get_family(family)
        opts = _family_options(
            fam,
            family_flags,
            dict(
                preset=preset or "tiny",
                checkpoint=checkpoint,
                seed=seed,
                max_batch=max_batch,
                batch_buckets=batch_buckets,
                kernels=kernels,
                dynamic_packages=dynamic_packages,
                device=device.split(":", 1)[0].strip().lower(),
            ),
        )
        names = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
        if names is not None:
            fam.check_stages(names)
    except OptionsError as e:
        raise click.UsageError(str(e)) from None
    # ---- the build
    load_check = None
    if not no_verify and "aoti" in formats:
        from .load_check import LoadCheck

        load_check = LoadCheck()  # its torch import runs while this process imports torch and builds
    try:
        from .build import build_family, stage_summary
        from .build_inputs import checkpoint_identity
        from .cache_layout import default_cache_dir
        from .parallel_compile import default_jobs
        from .stage_spec import with_tf32

        if dtype:
            opts.dtype = torch_dtype(dtype)
        if cxx:
            os.environ["CXX"] = cxx
        try:
            specs = fam.specs(opts, names)
        except OptionsError as e:  # a value this checkpoint/preset cannot build (e.g. a frame bucket too long)
            raise click.UsageError(str(e)) from None
        console = _err_console()
        if names is None and len(specs) < len(fam.stages):
            built = {s.name for s in specs}
            console.print(
                f"[dim]not in the checkpoint, not built: {', '.join(n for n in fam.stages if n not in built)}[/dim]"
            )
        if tf32:
            specs = [with_tf32(sp) for sp in specs]
        extra = {"max_autotune": True} if max_autotune else None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Table

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            result = build_family(
                family,
                specs,
                out_dir,
                device=device,
                seed=seed,
                preset=None if checkpoint else opts.preset,
                reporter=_RichReporter(progress),
                verify_in_subprocess=not no_verify,
                extra_inductor_options=extra,
                formats=formats,
                cache_dir=None if no_cache else (cache_dir or default_cache_dir()),
                cache_max_bytes=cache_max_bytes,
                jobs=jobs or default_jobs(),
                load_check=load_check,
                inputs={
                    "options": opts,
                    "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
                    "checkpoint_files": checkpoint_identity(checkpoint) if checkpoint else None,
                },
            )
        state = "up to date, checked" if result.up_to_date else "built"
        table = Table(title=f"{family} → {result.path} ({state}, {result.seconds:.0f}s)")
        cols = ("stage", "buckets", "packages", "dtype", "weights_mib", "package_mib") + (
            ("onnx_mib",) if "onnx" in formats else ()
        )
        for col in cols:
            table.add_column(col)
        for row in stage_summary(result):
            table.add_row(*(_show(row.get(c)) for c in cols))
        _out_console().print(table)
    except click.UsageError:
        raise
    except KeyboardInterrupt:
        _err_console().print("[red]interrupted[/red]: the previous artifact (if any) is unchanged")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - one line per failure unless --debug
        _fail(e, debug)
    finally:
        if load_check is not None:
            load_check.close()  # build_family closed it, unless the build failed before calling it


def _artifact_dir(path: str) -> str:
    """ARTIFACT must be one family's folder; a folder of artifacts (the --out of a build) is a usage error that
    names the artifacts inside."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    inside = sorted(
        os.path.join(path, d) for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, "manifest.json"))
    )
    if inside:
        raise click.UsageError(f"{path} holds artifacts, it is not one: pass one of {', '.join(inside)}")
    return path  # no manifest at all: the runtime says what is missing


def _pass_sum(reports: list[dict], key: str) -> int:
    """Σ of the pass reports' `dropped` / `folded` parameter counts (older artifacts: {"params": n} values)."""
    total = 0
    for rep in reports:
        for v in (rep.get(key) or {}).values():
            total += int(v.get("params", 0)) if isinstance(v, dict) else int(v)
    return total


def parameter_accounting(stage_entry: dict) -> dict[str, Any]:
    """Where the parameters of a stage went: loaded (the faithful module) = kept + pruned + folded; `skipped`:
    checkpoint tensors never loaded (known but unused: dropped; other model parts: ignored)."""
    ck = stage_entry.get("checkpoint") or {}
    loaded = (ck.get("params_before") or {}).get("params")
    kept = (ck.get("params_after") or {}).get("params")
    passes = stage_entry.get("passes") or []
    pruned, folded = _pass_sum(passes, "dropped"), _pass_sum(passes, "folded")
    out: dict[str, Any] = {
        "loaded": loaded,
        "kept": kept,
        "kept_mib": (ck.get("params_after") or {}).get("mib"),
        "pruned": pruned,
        "folded": folded,
        "unaccounted": None if loaded is None or kept is None else loaded - kept - pruned - folded,
        "skipped": {
            "dropped": sum(int(n) for n in (ck.get("dropped") or {}).values()),
            "ignored": (ck.get("ignored") or {}).get("params", 0),
        },
    }
    return out


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_debug_option
@click.pass_context
def inspect(ctx, artifact, as_json, debug_here):
    """Show an artifact: build environment, stages, buckets, sizes, where every parameter went."""
    artifact = _artifact_dir(artifact)
    try:
        from ..runtime.artifact import read_manifest

        m = json.loads(read_manifest(artifact).to_json())
        rows = []
        for name, st in m["stages"].items():
            ck = st.get("checkpoint", {})
            dropped = {k: v for p in st.get("passes", []) for k, v in (p.get("dropped") or {}).items()}
            dropped.update(ck.get("dropped") or {})
            packages = {b["file"]: b["bytes"] for b in st["buckets"]}
            metas = {f: _package_metadata(os.path.join(artifact, f)) for f in packages}  # each archive once
            rows.append(
                {
                    "stage": name,
                    "kind": st["kind"],
                    "dtype": st["dtype"],
                    "buckets": [b["key"] for b in st["buckets"]],
                    # buckets may share a dynamic-shape package: each file counted once
                    "packages": len(packages),
                    "packaging": st.get("packaging") or {},
                    "weights_mib": round(st["weights"]["bytes"] / 2**20, 3) if st.get("weights") else 0.0,
                    "packages_mib": round(sum(packages.values()) / 2**20, 3),
                    "params": parameter_accounting(st),
                    "params_before": ck.get("params_before"),
                    "params_after": ck.get("params_after"),
                    "dropped": dropped,
                    "ignored": ck.get("ignored"),
                    "tolerance": st["tolerance"],
                    "onnx": st.get("onnx"),
                    # how it was compiled and which numerics it runs: autotuned GEMMs, TF32 allowed (build --tf32)
                    "inductor_options": st.get("inductor_options") or {},
                    "kernels": st.get("kernels", "inductor"),
                    "tf32": bool((st.get("metadata") or {}).get("allow_tf32", False)),
                    # a stage's numerics choice and its build-time error vs fp32 (the Fish dac_decoder's precision)
                    "numerics": (st.get("metadata") or {}).get("numerics"),
                    # CUDA packages whose decode kernels launch with programmatic dependent launch (kernels/pdl.py)
                    "pdl_buckets": [b["key"] for b in st["buckets"] if _launches_with_pdl(metas[b["file"]])],
                    # CUDA packages whose skinny_linear tile form was traced streamed (TTSAOT_SKINNY_STREAM)
                    "stream_buckets": [
                        b["key"] for b in st["buckets"] if _cuda(metas[b["file"]], "ttsaot_skinny_stream")
                    ],
                    # CUDA packages whose 16-bit tile form computes W · xᵀ on warpgroup MMAs (TTSAOT_SKINNY_SWAP_AB)
                    "swap_ab_buckets": [
                        b["key"] for b in st["buckets"] if _cuda(metas[b["file"]], "ttsaot_skinny_swap_ab")
                    ],
                    # CUDA packages traced with the predictors' fused qkv + attention (TTSAOT_QKV_ATTENTION)
                    "qkv_attention_buckets": [
                        b["key"] for b in st["buckets"] if _cuda(metas[b["file"]], "ttsaot_qkv_attention")
                    ],
                    # CUDA packages traced with every RMSNorm kept in its projection's prologue (TTSAOT_NORM_OUT=0)
                    "norm_out_off_buckets": [
                        b["key"] for b in st["buckets"] if _cuda(metas[b["file"]], "ttsaot_norm_out_off")
                    ],
                    # CUDA packages traced with the LocDiT's attention inside o_proj (TTSAOT_ATTENTION_O=1)
                    "attention_o_buckets": [
                        b["key"] for b in st["buckets"] if _cuda(metas[b["file"]], "ttsaot_attention_o")
                    ],
                }
            )
        if as_json:
            _out_console().print_json(
                json.dumps(
                    {
                        "family": m["family"],
                        "device": m["device"],
                        "preset": m["preset"],
                        "build_env": m["build_env"],
                        "stages": rows,
                    }
                )
            )
            return
        from rich.table import Table

        env = m["build_env"]
        _out_console().print(
            f"[bold]{m['family']}[/bold] format v{m['format_version']} device={m['device']} "
            f"preset={_show(m['preset'])} torch={_show(env.get('torch'))} triton={_show(env.get('triton'))} "
            f"cuda={_show(env.get('cuda'))} gpu={_show(env.get('gpu_name'))} sm={_show(env.get('sm'))} "
            f"cxx={_show(env.get('cxx_version'))}",
            highlight=False,
        )
        # two tables, so that neither is squeezed below a readable width on an 80-column terminal
        t = Table(title="stages")
        for c in ("stage", "kind", "dtype", "buckets", "weights MiB", "packages MiB", "compiled with", "onnx"):
            t.add_column(c)
        params = Table(
            title="parameters",
            caption="loaded = kept + pruned (never read by the stage) + folded "
            "(baked into other tensors); skipped = checkpoint tensors "
            "never loaded",
        )
        for c in ("stage", "kept", "pruned", "folded", "loaded", "skipped"):
            params.add_column(c)
        for r in rows:
            p = r["params"]
            kept = f"{_show(p['kept'])} ({_show(p['kept_mib'])} MiB)"
            if p["unaccounted"]:
                kept += f" [red]unaccounted {p['unaccounted']}[/red]"
            skipped = p["skipped"]["dropped"] + p["skipped"]["ignored"]
            compiled = [
                f"kernels={r['kernels']}",
                *(f"{k}={v}" for k, v in r["inductor_options"].items()),
                *(["tf32"] if r["tf32"] else []),
                *_numerics_cell(r["numerics"]),
                *([f"pdl={','.join(r['pdl_buckets'])}"] if r["pdl_buckets"] else []),
                *([f"skinny_stream={','.join(r['stream_buckets'])}"] if r["stream_buckets"] else []),
                *([f"skinny_swap_ab={','.join(r['swap_ab_buckets'])}"] if r["swap_ab_buckets"] else []),
                *([f"qkv_attention={','.join(r['qkv_attention_buckets'])}"] if r["qkv_attention_buckets"] else []),
                *([f"norm_out_off={','.join(r['norm_out_off_buckets'])}"] if r["norm_out_off_buckets"] else []),
                *([f"attention_o={','.join(r['attention_o_buckets'])}"] if r["attention_o_buckets"] else []),
            ]
            t.add_row(
                r["stage"],
                r["kind"],
                r["dtype"],
                f"{len(r['buckets'])}: {' '.join(r['buckets'])}" + _packaging_cell(r["packages"], r["packaging"]),
                f"{r['weights_mib']}",
                f"{r['packages_mib']}",
                " ".join(compiled) or EMPTY,
                _onnx_cell(r["onnx"]),
            )
            params.add_row(
                r["stage"],
                kept,
                _show(p["pruned"] or None),
                _show(p["folded"] or None),
                _show(p["loaded"]),
                _show(skipped or None),
            )
        _out_console().print(t)
        _out_console().print(params)
    except Exception as e:  # noqa: BLE001
        _fail(e, _debug(ctx, debug_here))


def _package_metadata(package: str) -> dict:
    """A package's AOTI metadata, read from the archive without loading it; {} for anything unreadable."""
    import zipfile

    try:
        with zipfile.ZipFile(package) as z:
            name = next(n for n in z.namelist() if n.endswith("wrapper_metadata.json") and "/aotinductor/" in n)
            return json.loads(z.read(name))
    except (OSError, StopIteration, ValueError, zipfile.BadZipFile):
        return {}


def _cuda(meta: dict, flag: str) -> bool:
    """A CUDA package whose metadata sets `flag` to "1". CPU packages record the bucket's wish but launch no
    Triton kernel, so they never count."""
    return meta.get("AOTI_DEVICE_KEY") == "cuda" and meta.get(flag) == "1"


def _launches_with_pdl(meta: dict) -> bool:
    """Whether a package was compiled for CUDA with the programmatic-launch attribute (`ttsaot_pdl`,
    builder/kernels/pdl.py)."""
    return _cuda(meta, "ttsaot_pdl")


def _packaging_cell(n_packages: int, packaging: dict) -> str:
    """` in 1 package (dynamic batch 1-4, frames 8-300)`, or why the packages are static."""
    if not packaging:
        return ""
    axes: dict[str, list[str]] = {}
    for rec in (packaging.get("packages") or {}).values():
        for a, r in (rec.get("dynamic_axes") or {}).items():
            step = f" step {r['multiple_of']}" if r.get("multiple_of") else ""
            span = f"{r['min']}-{r['max']}{step}"
            if span not in axes.setdefault(a, []):
                axes[a].append(span)
    how = "dynamic " + ", ".join(f"{a} {' | '.join(v)}" for a, v in axes.items()) if axes else "static"
    reason = packaging.get("reason")
    why = (f"; static: {reason}" if axes else f": {reason}") if reason else ""
    return f" in {n_packages} package{'s' if n_packages != 1 else ''} ({how}{why})"


def _numerics_cell(numerics: dict | None) -> list[str]:
    """`numerics=bf16 by default (cuda) (38.2 dB vs fp32)`: the stage's precision choice, what chose it and what
    the build measured."""
    if not numerics:
        return []
    measured = numerics.get("measured") or {}
    by = f" by {numerics['chosen_by']}" if numerics.get("chosen_by") else ""
    err = f" ({measured['snr_db']} dB vs fp32)" if measured.get("snr_db") is not None else ""
    return [f"numerics={numerics.get('precision')}{by}{err}"]


def _onnx_cell(onnx: dict | None) -> str:
    """`file (opset N, X MiB[, +data Y MiB]) dyn: batch 1-4, frames 1-48`"""
    if not onnx:
        return EMPTY
    ext = sum(x["bytes"] for x in onnx.get("external_data", []))
    size = f"{onnx['bytes'] / 2**20:.2f} MiB" + (f" + data {ext / 2**20:.2f} MiB" if ext else "")
    dyn = ", ".join(f"{a} {r['min']}-{r['max']}" for a, r in onnx.get("dynamic_axes", {}).items())
    static = ", ".join(f"{a}={n}" for a, n in onnx.get("static_axes", {}).items())
    return f"{onnx['file']} (opset {onnx['opset']}, {size}) dynamic: {dyn or EMPTY}" + (
        f"; static: {static}" if static else ""
    )


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--device", default=None, help="Device to verify on [default: the artifact's].")
@click.option("--stages", default=None, help="Comma-separated subset of stages.")
@click.option("--no-graphs", is_flag=True, help="Run packages directly instead of replaying CUDA graphs.")
@click.option(
    "--onnx/--no-onnx",
    "check_onnx",
    default=True,
    show_default=True,
    help="Also run the stages' ONNX models (when present) with onnxruntime against the golden cases.",
)
@_debug_option
@click.pass_context
def verify(ctx, artifact, device, stages, no_graphs, check_onnx, debug_here):
    """Re-run the golden cases through the runtime (and onnxruntime for ONNX models); exit 1 on any regression.

    A sampled code may differ from the reference only at a near-tie (the reference's two best noisy scores closer
    than the stage's tolerance): such rows are counted, not failed."""
    artifact = _artifact_dir(artifact)
    try:
        from rich.table import Table

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
            bundle = load(
                artifact,
                device=device,
                stages=aoti if want or len(aoti) < len(selected) else None,
                cuda_graphs=not no_graphs,
            )
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
            ok = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
            if r.near_ties:
                ok += f" ({r.near_ties} near-tie row{'s' if r.near_ties > 1 else ''})"
            t.add_row(r.stage, r.case, r.output, "aoti", r.metric, f"{r.value:.3g}", f"{r.limit:.3g}", ok)
        for r in onnx_results:
            state = (
                f"[yellow]skipped[/yellow] {r.skipped[:80]}"
                if r.skipped
                else "[green]ok[/green]"
                if r.ok
                else "[red]FAIL[/red]"
            )
            t.add_row(
                r.stage,
                r.case,
                r.output,
                f"onnx {r.provider.removesuffix('ExecutionProvider')}",
                r.metric,
                f"{r.value:.3g}",
                f"{r.limit:.3g}",
                state,
            )
        _out_console().print(t)
        ran = list(results) + [r for r in onnx_results if not r.skipped]
        if not ran:
            why = f" (onnxruntime could not run the ONNX models: {onnx_results[0].skipped})" if onnx_results else ""
            raise RuntimeError(f"no golden cases to verify{why}")
        if not all(r.ok for r in ran):
            bad = next(r for r in ran if not r.ok)
            _err_console().print(
                f"[bold red]regression:[/bold red] {bad.stage}/{bad.case}/{bad.output} "
                f"{bad.metric}={bad.value:.3g} > {bad.limit:.3g}"
            )
            sys.exit(EXIT_FAILURE)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        _fail(e, _debug(ctx, debug_here))


# ------------------------------------------------------------------------------------------- package cache
_CACHE_DIR_OPTION = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    show_default="$TTSAOT_CACHE_DIR or $XDG_CACHE_HOME/ttsaot/packages",
    help="The package cache (as `build --cache-dir`).",
)


def _cache_root(cache_dir: str | None) -> Path:
    from .cache_layout import default_cache_dir  # torch-free

    return Path(cache_dir) if cache_dir else default_cache_dir()


@main.group()
def cache():
    """The package cache that builds reuse packages from: what it holds, and pruning it."""


@cache.command()
@_CACHE_DIR_OPTION
@_debug_option
@click.pass_context
def info(ctx, cache_dir, debug_here):
    """Entries, size and age of the package cache."""
    from rich.table import Table

    from .cache_prune import cache_bytes, cache_items

    root = _cache_root(cache_dir)
    try:
        items = cache_items(root)
        total = cache_bytes(root)
    except OSError as e:
        _fail(e, _debug(ctx, debug_here))
    now = time.time()
    t = Table(title=f"package cache {root}")
    for c in ("kind", "entries", "MB", "least recently used", "most recently used"):
        t.add_column(c)
    for kind in ("package", "golden"):
        of = [i for i in items if i.kind == kind]
        ages = [f"{(now - i.last_used) / 86400:.1f} days ago" for i in (of[:1] + of[-1:])] if of else [EMPTY, EMPTY]
        t.add_row(kind, str(len(of)), f"{sum(i.bytes for i in of) / 1e6:.1f}", ages[0], ages[-1])
    t.add_row("all", str(len(items)), f"{total / 1e6:.1f}", EMPTY, EMPTY)
    _out_console().print(t)


@cache.command()
@_CACHE_DIR_OPTION
@click.option(
    "--max-size",
    "max_bytes",
    required=True,
    callback=_cache_size,
    help="Remove least recently used entries down to this size (20GB, 512MiB; 0 removes every entry not in use).",
)
@_debug_option
@click.pass_context
def prune(ctx, cache_dir, max_bytes, debug_here):
    """Remove the package cache's least recently used entries down to --max-size (entries a running build
    holds stay)."""
    from .cache_prune import describe
    from .cache_prune import prune as prune_cache

    if max_bytes is None:
        raise click.BadParameter("a bound is needed to prune to (off means none)", param_hint="--max-size")
    try:
        res = prune_cache(_cache_root(cache_dir), max_bytes)
    except OSError as e:
        _fail(e, _debug(ctx, debug_here))
    _out_console().print(describe(res, max_bytes), highlight=False, soft_wrap=True)


@main.command(name="list")
@_debug_option
@click.pass_context
def list_cmd(ctx, debug_here):
    """List families, their stages, presets and build flags."""
    from rich.table import Table

    t = Table()
    for c in ("family", "stages", "presets", "build flags (beyond the generic ones)"):
        t.add_column(c)
    for name in FAMILIES:
        fam = get_family(name)
        t.add_row(name, ", ".join(fam.stages), ", ".join(fam.presets), " ".join(fl.name for fl in fam.flags))
    _out_console().print(t)


__all__ = ["main", "parameter_accounting"]

if __name__ == "__main__":
    main()
