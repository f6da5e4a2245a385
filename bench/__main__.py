"""`python -m bench [run] ...` measure · `python -m bench report` write BENCHMARKS.md ·
`python -m bench snake` · `python -m bench kernels` · `python -m bench conv-kernels` ·
`python -m bench decode-stages` · `python -m bench codec-stages` · `python -m bench memory` ·
`python -m bench builds` · `python -m bench bucket-hits` · `python -m bench list`. Internal: `_stage`,
`_coldstart`, `_snake` (the per-process workers)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

from ttsaot.runtime.dtypes import SHORT_DTYPE_NAMES

from .common import (
    INTERRUPTED,
    REPO,
    child_env,
    csv,
    cuda_device,
    default_device,
    git_commit,
    ints,
    now_iso,
    short_error,
    spawn,
    write_json,
)
from .families import family_commands


def _add_measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny (default on CPU)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=list(SHORT_DTYPE_NAMES), help="override the stage dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--axis",
        action="append",
        default=None,
        metavar="NAME=SIZES",
        help="bucket sizes of an axis, e.g. --axis batch=1,4 --axis frames=25,50",
    )
    p.add_argument(
        "--variants",
        type=csv,
        default=None,
        help="comma-separated subset (default: all on CUDA; eager_raw,eager,ttsaot_nograph on CPU)",
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions (3 warm-up, 10 timed)")
    p.add_argument(
        "--compile-budget",
        type=float,
        default=240.0,
        help="seconds per torch.compile variant (setup + all buckets) before it is recorded skipped",
    )
    p.add_argument("--variant-budget", type=float, default=300.0, help="seconds for any other variant")
    p.add_argument("--build-budget", type=float, default=420.0, help="seconds for the artifact build")
    p.add_argument(
        "--compile-mode",
        default="max-autotune-no-cudagraphs",
        help="torch.compile mode of compile_graph/upstream_compile and the compile cold start",
    )
    p.add_argument(
        "--coldstart-compile-mode",
        default=None,
        help="mode for the torch.compile cold start (default: --compile-mode; 'default' is cheaper)",
    )
    p.add_argument("--cache-dir", default=str(REPO / "bench" / ".cache"))
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the variants/buckets of the existing result file that this run does not measure",
    )
    _add_coldstart_options(p)
    p.add_argument("--verify-build", action="store_true", help="also run the builder's subprocess verification")
    p.add_argument("--stream-seconds", type=float, default=None, help="utterance length (default 10; CPU 0.25)")
    p.add_argument(
        "--stream-variants",
        type=csv,
        default=None,
        help="variants measured streaming (codec decoders); default eager,eager_graph,compile_graph,"
        "ttsaot_nograph,ttsaot_graph",
    )
    p.add_argument("--throughput-batches", type=ints, default=None, help="default 1,2,4,8,16 (CPU: 1,2)")
    p.add_argument(
        "--throughput-variants",
        type=csv,
        default=None,
        help="default eager,ttsaot_graph (CPU: eager,ttsaot_nograph)",
    )


def _add_coldstart_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-coldstart", dest="coldstart", action="store_false")
    p.add_argument("--coldstart-budget", type=float, default=300.0, help="seconds per cold-start process")
    p.add_argument(
        "--coldstart-modes",
        type=csv,
        default=None,
        help="ttsaot,compile (default on CUDA); ttsaot only on CPU",
    )


def _finish_measure_args(a) -> None:
    from .variants import ALL_VARIANTS, DEFAULT_CPU

    a.device = a.device or default_device()
    cuda = a.device.startswith("cuda")
    a.preset = a.preset or ("full" if cuda else "tiny")
    a.dtype_explicit = a.dtype  # names the result file; the CPU fp32 default does not
    if not cuda and a.dtype is None:
        a.dtype = "fp32"  # bf16 convolutions on CPU take a slow reference path: CPU runs are smoke tests
    a.variants = a.variants or list(ALL_VARIANTS if cuda else DEFAULT_CPU)
    unknown = [v for v in a.variants if v not in ALL_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown} (known: {', '.join(ALL_VARIANTS)})")
    a.stream_variants = a.stream_variants or [
        "eager",
        "eager_graph",
        "compile_graph",
        "ttsaot_nograph",
        "ttsaot_graph",
    ]
    a.throughput_batches = a.throughput_batches or ([1, 2, 4, 8, 16] if cuda else [1, 2])
    a.throughput_variants = a.throughput_variants or (
        ["eager", "ttsaot_graph"] if cuda else ["eager", "ttsaot_nograph"]
    )
    a.coldstart_compile_mode = a.coldstart_compile_mode or a.compile_mode
    a.coldstart_modes = a.coldstart_modes or (["ttsaot", "compile"] if cuda else ["ttsaot"])
    if a.stream_seconds is None:
        a.stream_seconds = 10.0 if cuda else 0.25


def merge_results(old: dict, new: dict) -> dict:
    """`run --merge`: the new run's figures, plus the old file's variants, buckets and top-level sections the new
    run did not measure (each merged variant names the run it came from). For adding a variant or a bucket to a
    stage without re-measuring the rest; the table then mixes two processes, which the JSON says."""
    if old.get("device", {}).get("slug") != new.get("device", {}).get("slug"):
        return new
    origin = {"started": old.get("started"), "git_commit": old.get("git_commit")}
    out = dict(new)
    for key, value in old.items():
        if key not in out:  # a section the new run did not measure, named as the old run's
            out[key] = {**value, "merged_from": origin} if isinstance(value, dict) and key != "device" else value
    variants = dict(new.get("variants", {}))
    for name, rec in old.get("variants", {}).items():
        if name not in variants or not variants[name].get("buckets"):
            variants[name] = {**rec, "merged_from": rec.get("merged_from", origin)}
            continue
        for k, cell in rec.get("buckets", {}).items():
            variants[name]["buckets"].setdefault(k, {**cell, "merged_from": cell.get("merged_from", origin)})
    out["variants"] = variants
    keys = {b["key"] for b in new.get("buckets", [])}
    out["buckets"] = list(new.get("buckets", [])) + [b for b in old.get("buckets", []) if b["key"] not in keys]
    out["floor"] = {**old.get("floor", {}), **new.get("floor", {})}
    if "stage" in new and "axes" in old.get("stage", {}):  # the header names every bucket the tables show
        axes = {**old["stage"]["axes"]}
        for axis, sizes in new["stage"].get("axes", {}).items():
            axes[axis] = sorted(set(axes.get(axis, [])) | set(sizes))
        out["stage"] = {**new["stage"], "axes": axes}
    out["notes"] = list(new.get("notes", [])) + [
        f"merged with the run of {origin['started']} (commit {origin['git_commit']}): entries marked merged_from"
    ]
    return out


def result_name(family: str, stage: str, dtype: str | None) -> str:
    """One JSON per stage; a run with a dtype override (e.g. a bf16 build of an fp32 stage next to its default) gets
    its own file instead of replacing the default's."""
    return f"{family}__{stage}" + (f"__{dtype}" if dtype else "") + ".json"


def _worker_args(a) -> list[str]:
    out = [
        "--device",
        a.device,
        "--preset",
        a.preset,
        "--seed",
        str(a.seed),
        "--variants",
        ",".join(a.variants),
        "--compile-budget",
        str(a.compile_budget),
        "--variant-budget",
        str(a.variant_budget),
        "--build-budget",
        str(a.build_budget),
        "--compile-mode",
        a.compile_mode,
        "--cache-dir",
        a.cache_dir,
        "--stream-seconds",
        str(a.stream_seconds),
        "--stream-variants",
        ",".join(a.stream_variants),
        "--throughput-batches",
        ",".join(map(str, a.throughput_batches)),
        "--throughput-variants",
        ",".join(a.throughput_variants),
    ]
    if a.dtype:
        out += ["--dtype", a.dtype]
    if a.quick:
        out.append("--quick")
    if a.verify_build:
        out.append("--verify-build")
    if not a.coldstart:
        out.append("--no-coldstart")
    out += [
        "--coldstart-budget",
        str(a.coldstart_budget),
        "--coldstart-modes",
        ",".join(a.coldstart_modes),
        "--coldstart-compile-mode",
        a.coldstart_compile_mode,
    ]
    for ax in a.axis or []:
        out += ["--axis", ax]
    return out


# ------------------------------------------------------------------------------------------------ run
def cmd_run(a) -> int:
    """Each stage in its own process (bench/stage.py) under its timeout and the global budget; one JSON each."""
    _finish_measure_args(a)
    t_begin = time.time()
    todo, problems = _stages_to_measure(a)
    env = child_env(a.device)

    def left() -> float:
        return a.time_budget - (time.time() - t_begin) if a.time_budget else float("inf")

    summary: list[dict] = []
    if (a.snake and a.device.startswith("cuda")) or a.snake_cpu:
        summary.append(_run_snake_worker(a, env, min(300.0, left())))
    for fam, st in todo:
        remaining = left()
        if remaining < 30:
            summary.append({"stage": f"{fam}/{st}", "status": "skipped", "detail": "global --time-budget used up"})
            continue
        summary.append(_run_stage_worker(a, fam, st, env, min(a.stage_timeout, remaining)))
    _print_summary(summary, problems, time.time() - t_begin)
    return 0 if all(s["status"] in ("ok", "skipped") for s in summary) and summary else 1


def _stages_to_measure(a) -> tuple[list[tuple[str, str]], list[str]]:
    """((family, stage) to measure, problems to report) for --family / --stages."""
    from .specs import family_names, stage_names

    families = a.family or family_names()
    todo: list[tuple[str, str]] = []
    problems: list[str] = []
    for fam in families:
        try:
            names = stage_names(fam, a.preset)
        except Exception as e:  # noqa: BLE001 - a family still being written must not stop the others
            problems.append(f"{fam}: cannot list stages ({short_error(e)})")
            continue
        todo += [(fam, st) for st in names if not a.stages or st in a.stages]
    if a.stages:
        missing = [s for s in a.stages if s not in {st for _, st in todo}]
        problems += [f"stage {s!r} not found in {', '.join(families)}" for s in missing]
    return todo, problems


def _run_snake_worker(a, env: dict, timeout: float) -> dict:
    r = _spawn_json(
        [sys.executable, "-m", "bench", "_snake", "--device", a.device] + (["--quick"] if a.quick else []), env, timeout
    )
    if r.get("device"):
        write_json(Path(a.out) / r["device"]["slug"] / "snake_kernel.json", r)
    return {"stage": "snake_kernel", "status": r.get("status", "failed"), "detail": _snake_summary(r)}


def _run_stage_worker(a, fam: str, st: str, env: dict, timeout: float) -> dict:
    """`python -m bench _stage` for one stage; its result (completed, merged) written under --out; a summary row."""
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp:
        tmp_json = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "bench",
            "_stage",
            "--family",
            fam,
            "--stage",
            st,
            "--result",
            str(tmp_json),
            *_worker_args(a),
        ]
        print(f"[bench] {fam}/{st}: measuring (timeout {timeout:.0f} s)", file=sys.stderr, flush=True)
        t0 = time.time()
        rc, err_tail = spawn(cmd, env, timeout, Path(a.cache_dir) / "logs" / f"{fam}__{st}.log")
        res = json.loads(tmp_json.read_text()) if tmp_json.is_file() else None
    summary = _record_stage(a, fam, st, rc, err_tail, res, t0)
    if rc == INTERRUPTED:  # what the stage measured is written; the interrupt still stops the run
        raise KeyboardInterrupt
    return summary


def _record_stage(a, fam: str, st: str, rc: int, err_tail: str, res: dict | None, t0: float) -> dict:
    """A stage worker's result (None: it wrote none) completed, merged and written under --out; a summary row."""
    out_root = Path(a.out)
    if res is not None and "stage" not in res:  # died before its StageSpec existed (family in progress)
        res = None
    if res is None:
        if a.record_failures:
            dev = _device_info(a.device)
            write_json(
                out_root / dev["slug"] / result_name(fam, st, a.dtype_explicit),
                {
                    "schema": 1,
                    "status": "failed",
                    "reason": err_tail,
                    "device": dev,
                    "git_commit": git_commit(),
                    "started": now_iso(),
                    "stage": {"family": fam, "stage": st},
                },
            )
        return {"stage": f"{fam}/{st}", "status": "failed", "detail": err_tail}
    if rc != 0:
        res["status"] = "incomplete"
        res["reason"] = err_tail
        for v in res.get("variants", {}).values():
            if v.get("status") == "running":
                v.update(status="incomplete", reason=f"the stage process ended: {err_tail}")
    res["worker_wall_s"] = round(time.time() - t0, 1)
    path = out_root / res["device"]["slug"] / result_name(fam, st, a.dtype_explicit)
    if a.merge and path.is_file():
        res = merge_results(json.loads(path.read_text()), res)
    write_json(path, res)
    return {"stage": f"{fam}/{st}", "status": res.get("status"), "detail": _stage_summary(res), "path": str(path)}


def _device_info(device: str) -> dict:
    from .common import device_info

    return device_info(cuda_device(device))


def _spawn_json(cmd, env, timeout) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        p = Path(tmp) / "r.json"
        rc, tail = spawn([*cmd, "--result", str(p)], env, timeout)
        if p.is_file():
            return json.loads(p.read_text())
        return {"status": "failed", "reason": tail}


def _snake_summary(r: dict) -> str:
    parts = []
    for name, c in r.get("cases", {}).items():
        k = c.get("kernel", {})
        if "gb_per_s" in k:
            parts.append(f"{name}: kernel {k['gb_per_s']:.0f} GB/s = {k['ratio_to_copy']:.0%} of copy")
        else:
            parts.append(f"{name}: {k.get('status', c.get('error', '?'))}")
    return "; ".join(parts) or r.get("reason", "")


def _stage_summary(res: dict) -> str:
    parts = []
    for name, v in res.get("variants", {}).items():
        if v.get("status") == "ok" and v.get("buckets"):
            k, b = next(iter(v["buckets"].items()))
            parts.append(f"{name} {b['ms']:.3g} ms" + (f" ({b['x_floor']:.1f}×floor)" if "x_floor" in b else ""))
        else:
            parts.append(f"{name} {v.get('status')}")
    if res.get("status") not in (None, "ok") and res.get("reason"):
        parts.append(str(res["reason"])[:200])  # why the stage stopped (timeout, crash), also when cut mid-way
    return "; ".join(parts)


def _print_summary(rows: list[dict], problems: list[str], seconds: float) -> None:
    print(f"\n== bench summary ({seconds:.0f} s) ==")
    for r in rows:
        print(f"{r['stage']:<40} {r['status']:<10} {r.get('detail', '')}")
        if r.get("path"):
            print(f"{'':<40} → {r['path']}")
    for p in problems:
        print(f"note: {p}")


# ----------------------------------------------------------------------------------------------- main
# subcommands defined by a module of their own, with `add_parser(subparsers)` and `main(args) -> int`
MODULE_COMMANDS = {
    "build": "bench.prebuild",
    "profile": "bench.profile",
    "conv-kernels": "bench.conv_kernels",
    "decode-stages": "bench.decode_stages",
    "codec-stages": "bench.codec_stages",
    "memory": "bench.memory",
    "builds": "bench.build_times",
    "bucket-hits": "bench.bucket_hits",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_coldstart"]:
        # The cold-start child parses only its own options: the full parser imports every family's bench module,
        # and they import the builder (Triton, the kernel layer, dynamo: ~2 s on the 2-core CPU box) — start-up a
        # serving process does not pay, which the child would otherwise count before its first output.
        ap = argparse.ArgumentParser(prog="python -m bench")
        _add_coldstart_parser(ap.add_subparsers(dest="cmd", required=True))
        return cmd_coldstart(ap.parse_args(argv))
    if not argv or argv[0] not in commands() + ("-h", "--help"):
        argv = ["run", *argv]
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_measure_parsers(sub)
    _add_tool_parsers(sub)
    modules = {
        name: importlib.import_module(module) for name, module in {**MODULE_COMMANDS, **family_commands()}.items()
    }
    for module in modules.values():
        module.add_parser(sub)
    a = ap.parse_args(argv)
    if a.cmd in modules:
        return modules[a.cmd].main(a)
    return HANDLERS[a.cmd](a)


def _add_measure_parsers(sub) -> None:
    """`run` and its per-process workers `_stage`, `_coldstart`."""
    p = sub.add_parser("run", help="measure stages (one subprocess per stage) and write JSON results")
    p.add_argument("--family", type=csv, default=None, help="families (default: all registered)")
    p.add_argument("--stages", type=csv, default=None, help="stage names (default: all of each family)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--stage-timeout", type=float, default=600.0, help="seconds per stage process")
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    p.add_argument("--no-snake", dest="snake", action="store_false", help="skip the SnakeBeta kernel bench")
    p.add_argument("--snake-cpu", action="store_true", help="run the snake bench on CPU too (smoke)")
    p.add_argument(
        "--record-failures",
        action="store_true",
        help="write a status=failed JSON for a stage whose process produced nothing",
    )
    _add_measure_options(p)

    p = sub.add_parser("_stage")
    p.add_argument("--family", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--result", required=True)
    _add_measure_options(p)

    _add_coldstart_parser(sub)


def _add_coldstart_parser(sub) -> None:
    p = sub.add_parser("_coldstart")
    for opt in (
        "--mode",
        "--device",
        "--inputs",
        "--stage",
        "--family",
        "--preset",
        "--axes",
        "--compile-mode",
        "--artifact",
    ):
        p.add_argument(opt, required=opt in ("--mode", "--device", "--inputs", "--stage"))
    p.add_argument("--dtype", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t-spawn", type=float, required=True)
    p.add_argument("--warmup-calls", type=int, default=None)


def _add_tool_parsers(sub) -> None:
    """`snake`, `kernels`, `report`, `list`."""
    for name in ("snake", "_snake"):
        p = sub.add_parser(name, help="SnakeBeta kernel vs copy bandwidth" if name == "snake" else None)
        p.add_argument("--device", default=None)
        p.add_argument("--shape", type=ints, default=None)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--result", default=None)
        p.add_argument("--out", default=str(REPO / "bench" / "results"))

    from .kernels import SECTIONS as KERNEL_SECTIONS

    p = sub.add_parser("kernels", help="the Triton kernel layer on the stages' shapes vs copy bandwidth and torch")
    p.add_argument("--device", default=None)
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    p.add_argument("--budget", type=float, default=200.0, help="seconds; later cases and sections are skipped")
    p.add_argument(
        "--sections",
        type=csv,
        default=None,
        help=",".join(KERNEL_SECTIONS) + " (default: not the last eight)",
    )
    p.add_argument("--with-compile", action="store_true", help="layer: also torch.compile max-autotune (minutes)")
    p.add_argument("--result", default=None)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))

    p = sub.add_parser("report", help="write BENCHMARKS.md (and plots) from bench/results/*/*.json")
    p.add_argument("--results", default=str(REPO / "bench" / "results"))
    p.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    p.add_argument("--plots", default=None, help="plot folder (default: <results>/plots)")
    p.add_argument("--include-cpu", action="store_true", help="also report CPU results (not publishable)")

    sub.add_parser("list", help="families, stages and the buckets the bench would measure")


def cmd_stage(a) -> int:
    _finish_measure_args(a)
    from .specs import parse_axes
    from .stage import run_stage

    axes = parse_axes(a.axis)
    a.axes = json.dumps({k: list(v) for k, v in axes.items()}) if axes else None
    run_stage(a)
    return 0


def cmd_coldstart(a) -> int:
    from .coldstart import child_main

    child_main(a)
    return 0


def cmd_snake(a) -> int:
    import torch

    from .snake import run_snake

    dev = torch.device(a.device or default_device())
    r = run_snake(dev, tuple(a.shape) if a.shape else None, a.quick)
    path = Path(a.result) if a.result else Path(a.out) / r["device"]["slug"] / "snake_kernel.json"
    write_json(path, r)
    if a.cmd == "snake":
        print(_snake_summary(r))
        print(f"→ {path}")
    return 0


def cmd_kernels(a) -> int:
    import torch

    from .common import device_info
    from .kernels import DEFAULT_SECTIONS, run_kernels, summary

    dev = torch.device(a.device or default_device())
    slug = device_info(dev)["slug"]
    path = Path(a.result) if a.result else Path(a.out) / slug / "kernels.json"
    r = run_kernels(
        dev,
        a.quick,
        a.budget,
        tuple(a.sections or DEFAULT_SECTIONS),
        a.with_compile,
        progress=lambda res: write_json(path, res),
    )
    write_json(path, r)
    print(summary(r))
    print(f"→ {path}")
    return 0 if r.get("status") == "ok" else 1


def cmd_report(a) -> int:
    from .report import write_report

    path = write_report(Path(a.results), Path(a.output), Path(a.plots) if a.plots else None, a.include_cpu)
    print(f"wrote {path}")
    return 0


def cmd_list(a) -> int:
    from .specs import family_names, make_spec, stage_names

    for fam in family_names():
        try:
            for st in stage_names(fam, "full"):
                try:
                    spec, desc = make_spec(fam, st, "full")
                    print(f"{fam}/{st}: kind={spec.kind} dtype={desc['dtype']} buckets={desc['axes']}")
                except Exception as e:  # noqa: BLE001
                    print(f"{fam}/{st}: {short_error(e)}")
        except Exception as e:  # noqa: BLE001
            print(f"{fam}: {short_error(e)}")
    return 0


HANDLERS = {
    "run": cmd_run,
    "_stage": cmd_stage,
    "_coldstart": cmd_coldstart,
    "snake": cmd_snake,
    "_snake": cmd_snake,
    "kernels": cmd_kernels,
    "report": cmd_report,
    "list": cmd_list,
}


def commands() -> tuple[str, ...]:
    """Every subcommand. A function, not a module constant: the families' own subcommands need their bench modules
    imported, which the cold-start child must not do."""
    return (*HANDLERS, *MODULE_COMMANDS, *family_commands())


if __name__ == "__main__":
    sys.exit(main())
