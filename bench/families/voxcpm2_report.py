"""The BENCHMARKS.md section of a `python -m bench voxcpm-loop` result (kind "decode_loop"), rendered by
`bench report` through `BenchFamily.report_sections`."""

from __future__ import annotations

from ..report import _fmt_ms, _table

STEP_STAGES = ("base_lm_step", "residual_lm_step", "locdit", "local_encoder")  # one decode step


def stage_sum_per_step(stages: list[dict], batch: str, variant: str = "ttsaot_graph") -> float | None:
    """Σ of the per-stage medians of one decode step (the four loop stages' `variant` at batch bucket `batch`),
    from the per-stage result files of the same device; None unless all four were measured."""
    total = 0.0
    for name in STEP_STAGES:
        res = next(
            (
                r
                for r in stages
                if r.get("stage", {}).get("family") == "voxcpm2"
                and r.get("stage", {}).get("stage") == name
                and not r["stage"].get("dtype_override")
            ),
            None,
        )
        cell = (res or {}).get("variants", {}).get(variant, {}).get("buckets", {}).get(f"b{batch}")
        if not cell or "ms" not in cell:
            return None
        total += cell["ms"]
    return total


def decode_loop_section(res: dict, stages: list[dict] | None = None) -> str:
    """`python -m bench voxcpm-loop` (bench/families/voxcpm2_loop.py): the whole VoxCPM2 decode step, ttsaot vs
    upstream."""
    st, audio, summ = res.get("stage", {}), res.get("audio", {}), res.get("summary", {})
    cfg = res.get("settings", {})
    ms_audio = audio.get("audio_ms_per_step")
    lines = ["### VoxCPM2 decode loop", ""]
    if res.get("status") != "ok":
        lines += [f"**status: {res.get('status')}** {res.get('reason', '')}".rstrip(), ""]
    lines += [
        f"preset {st.get('preset')}, LM/DiT dtype {st.get('dtype', '?')}, KV cache {st.get('max_len')} positions "
        f"({st.get('context')} prefilled), batch buckets {st.get('buckets')}, CFM {st.get('n_timesteps', '?')} "
        f"Euler steps, CFG "
        f"{st.get('cfg_rate', '?')}; {cfg.get('reps', '?')} timed steps per cell after {cfg.get('warmup', '?')} "
        f"warm-up; commit `{str(res.get('git_commit', '?'))[:12]}`; {res.get('started', '')}",
        "",
        "One step = `locdit` (CFM solve) → `local_encoder` → stop flag to the host → `base_lm_step` → "
        f"`residual_lm_step` = {audio.get('frames_per_step', '?')} latent frames = "
        f"{_fmt_ms(ms_audio)} ms of audio per request; RTF = step time / that (lower is better). ttsaot = the "
        "artifacts driven as `VoxCPM2Decoder` drives them; upstream = `voxcpm`'s own loop "
        "(`VoxCPM2Model._inference`) with the same random weights; `stream` = `VoxCPM2Decoder.stream` end to "
        "end (VAE every 3 steps included).",
        "",
    ]
    tts = res.get("ttsaot", {}).get("steps", {}).get("batches", {})
    up = res.get("upstream", {})

    def cell(src: dict, b: str, key: str = "step_ms") -> str:
        c = src.get(b, {})
        if key in c:
            return f"{_fmt_ms(c[key])} ({c[key] / ms_audio:.3g})" if ms_audio else _fmt_ms(c[key])
        return c.get("status", "—") if c else "—"

    rows = []
    for b in [str(x) for x in st.get("batches", [])]:
        stream = tts.get(b, {}).get("stream", {})
        row = summ.get("batches", {}).get(b, {})
        ttsaot_ms = row.get("ttsaot_ms") or tts.get(b, {}).get("step_ms")
        up_opt = row.get("upstream_optimize_ms") or up.get("optimize", {}).get("batches", {}).get(b, {}).get("step_ms")
        speed = f"{up_opt / ttsaot_ms:.1f}×" if up_opt and ttsaot_ms else "—"
        rows.append(
            [
                b,
                cell(tts, b),
                cell({b: stream}, b, "ms_per_step"),
                cell(up.get("eager", {}).get("batches", {}), b),
                cell(up.get("optimize", {}).get("batches", {}), b),
                speed,
            ]
        )
    # the stages' own result files stand in only for a batch whose loop was not timed in this run
    untimed = [str(x) for x in st.get("batches", []) if "step_ms" not in tts.get(str(x), {})]
    sums = {b: stage_sum_per_step(stages or [], b) for b in untimed}
    if any(v is not None for v in sums.values()):
        for row in rows:
            v, up_ms = sums.get(row[0]), up.get("optimize", {}).get("batches", {}).get(row[0], {}).get("step_ms")
            row.insert(2, f"{_fmt_ms(v)} ({v / ms_audio:.3g})" if v is not None and ms_audio else "—")
            if row[-1] == "—" and v and up_ms:
                row[-1] = f"{up_ms / v:.1f}× (Σ)"
        head = [
            "batch",
            "ttsaot",
            "ttsaot Σ stages",
            "ttsaot stream",
            "upstream eager",
            "upstream optimize()",
            "ttsaot speed-up vs optimize()",
        ]
        note = (
            "`ttsaot Σ stages` = the sum of the four loop stages' `ttsaot_graph` medians from their own "
            "result files (separate processes, same device), used where the loop itself was not timed in "
            "this run."
        )
    else:
        head = [
            "batch",
            "ttsaot",
            "ttsaot stream",
            "upstream eager",
            "upstream optimize()",
            "ttsaot speed-up vs optimize()",
        ]
        note = ""
    merged = up.get("merged_from")
    if merged:  # the upstream loop was not re-timed: its figures come from an earlier run (bench run --merge)
        note = (note + " " if note else "") + (
            f"The upstream columns come from the run of {merged.get('started')} (commit "
            f"`{str(merged.get('git_commit'))[:12]}`, same device kind), not re-timed in this one."
        )
    lines += ["Per decode step, ms (RTF):", "", _table(head, rows), ""] + ([note, ""] if note else [])
    comp = [(b, c["components_ms"]) for b, c in tts.items() if c.get("components_ms")]
    if comp:
        names = list(comp[0][1])
        rows = [
            [b]
            + [_fmt_ms(c.get(n)) for n in names]
            + [_fmt_ms(tts[b].get("components_sum_ms")), _fmt_ms(tts[b].get("step_ms"))]
            for b, c in comp
        ]
        lines += [
            "ttsaot, each stage alone, ms:",
            "",
            _table(["batch"] + [f"`{n}`" for n in names] + ["sum", "step"], rows),
            "",
        ]
    vae = res.get("ttsaot", {}).get("vae", {})
    if "ms" in vae:
        lines += [
            f"VAE decode of {vae.get('new_frames')} new frames (+ {vae.get('left_context_frames')} frames "
            f"of left context), batch 1: {_fmt_ms(vae['ms'])} ms for {_fmt_ms(vae.get('audio_ms'))} ms of "
            f"audio (RTF {vae.get('rtf', 0):.3g}).",
            "",
        ]
    fs = res.get("first_step", {})
    if fs:
        rows = []
        for mode, r in fs.items():
            if "first_step_s" not in r:
                rows.append([mode, "—", f"{r.get('status')}: {r.get('reason', '')}"])
                continue
            parts = [
                f"{k.removesuffix('_s')} {r[k]:.2f} s"
                for k in ("startup_s", "load_s", "model_s", "caches_s", "first_patch_s")
                if k in r
            ]
            parts.append(f"step {r.get('first_step_ms', 0):.0f} ms")
            rows.append([mode, f"{r['first_step_s']:.2f}", ", ".join(parts)])
        lines += [
            "First step after process start (fresh process, B=1):",
            "",
            _table(["path", "seconds", "breakdown"], rows),
            "",
        ]
    par = res.get("parity", {}).get("batches", {})
    if par:
        lines += [
            "Parity, upstream loop vs ttsaot loop from the same prefill with the same noise, max rel err "
            "of the generated patches: "
            + "; ".join(
                f"B={b}: {p['max_rel_err']:.2e} over {p['steps']} steps ({p.get('dtype')})"
                if "max_rel_err" in p
                else f"B={b}: {p.get('status')} {p.get('reason', '')}"
                for b, p in par.items()
            ),
            "",
        ]
    tg = res.get("targets", {})
    b1, f1 = summ.get("batches", {}).get("1", {}).get("ttsaot_ms"), fs.get("ttsaot", {}).get("first_step_s")
    lines += [
        f"Targets ({tg.get('stated_for', '?')}; measured on {res.get('device', {}).get('name', '?')}): "
        f"B=1 step ≤ {tg.get('step_ms_b1')} ms: "
        + ("—" if b1 is None else f"**{'met' if summ.get('step_ms_b1_target_met') else 'not met'}** ({_fmt_ms(b1)} ms)")
        + f"; first step ≤ {tg.get('first_step_s')} s: "
        + ("—" if f1 is None else f"**{'met' if summ.get('first_step_target_met') else 'not met'}** ({f1:.2f} s)"),
        "",
    ]
    missing = []
    for path, rec in (
        ("build", res.get("build", {})),
        ("load", res.get("load", {})),
        *((f"ttsaot/{k}", v) for k, v in res.get("ttsaot", {}).items()),
        *((f"upstream/{k}", v) for k, v in up.items() if isinstance(v, dict)),
        *((f"first_step/{k}", v) for k, v in fs.items()),
    ):
        if isinstance(rec, dict) and rec.get("status") not in (None, "ok"):
            missing.append(f"`{path}` {rec.get('status')}: {rec.get('reason', '')}")
    for name, src in (
        ("ttsaot", tts),
        ("upstream eager", up.get("eager", {}).get("batches", {})),
        ("upstream optimize()", up.get("optimize", {}).get("batches", {})),
    ):
        missing += [
            f"{name} B={b} {c.get('status')}: {c.get('reason', '')}"
            for b, c in src.items()
            if c.get("status") not in (None, "ok")
        ]
    if missing:
        lines += ["Not measured: " + "; ".join(missing), ""]
    if up.get("imports"):
        lines += ["Upstream imported with: " + "; ".join(up["imports"]) + ".", ""]
    return "\n".join(lines)
