"""bench/gpu_plan.sh: every committed plan parses, every line runs with its budget substituted, in order."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLANS = sorted((REPO / "bench" / "plans").glob("*.txt"))


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_plan_lines_run_in_order_with_their_budgets(plan, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    (fake / "python3").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n')  # records instead of running
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_plan.sh"), str(plan)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in plan.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    ran = [c for c in calls.read_text().splitlines() if not c.startswith(("-m pip", "-m bench report"))]
    assert len(ran) == len(lines) and "no time left" not in proc.stdout
    for line, call in zip(lines, ran):
        secs = int(line.split("|", 1)[0])
        assert "BUDGET" not in call and "$" not in call
        if "BUDGET" in line:
            assert str(secs - 10) in call.split()
    assert (tmp_path / "out" / "bench_results.tar.gz").is_file()


def test_a_failed_gate_line_skips_the_rest_of_the_plan(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    # records every call; the gate command (`-c gate`) fails
    (fake / "python3").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n[ "$2" = gate ] && exit 3\nexit 0\n')
    (fake / "python3").chmod(0o755)
    plan = tmp_path / "plan.txt"
    plan.write_text("40|python3 -c first\n!40|python3 -c gate\n40|python3 -c after\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_plan.sh"), str(plan)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    ran = [c for c in calls.read_text().splitlines() if c.startswith("-c ")]
    assert ran == ["-c first", "-c gate"] and "gate failed" in proc.stdout
    assert (tmp_path / "out" / "bench_results.tar.gz").is_file()  # what ran before the gate still comes back
