"""A pytest plugin for the GPU suite's device calls (issue 17): the CPU seconds each test item costs, its setup
(the fixture builds) included, counted over the xdist worker's whole process tree — the worker, its compile workers
and their Inductor compile subprocesses, live or finished.

    python -m pytest -p bench.probes.suite_cpu_time ...   → $TEST_CPU_DIR/cpu_<worker>.tsv (one line per item)
    python -m bench.probes.suite_cpu_time DIR            → the items by CPU seconds, and their sum

The suite's cold pass is CPU-bound (vmstat: 16 cores ~97 % busy): its wall time is the CPU work over the cores, so
the items to trim are the ones with the most CPU seconds, not the longest walls (a build waiting for cores is long
and may be cheap). Counted per item: the tree's user + system time before and after, where a process's time is its
own plus that of the children it has reaped (/proc/<pid>/stat fields 14-17; the worker's reaped children through
`resource.getrusage(RUSAGE_CHILDREN)`). A descendant whose parent exits without reaping it is lost (none of the
pools does that: they shut down their workers)."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, own + reaped children's CPU seconds) of a live process, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICK


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds of `root` (this process) and every live descendant, each with the children it has reaped."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = got
    total = 0.0
    for pid in cpu:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root and pid != root:
            total += cpu[pid]
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, c0 = time.time(), tree_cpu_seconds()
    yield
    t1, c1 = time.time(), tree_cpu_seconds()
    out = Path(os.environ.get("TEST_CPU_DIR", "."))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(out / f"cpu_{worker}.tsv", "a") as f:
        f.write(f"{c1 - c0:.1f}\t{t1 - t0:.1f}\t{t0:.1f}\t{worker}\t{item.nodeid}\n")


def summary(folder: Path, top: int = 40) -> str:
    rows = []
    for f in sorted(folder.glob("cpu_*.tsv")):
        for line in f.read_text().splitlines():
            cpu, wall, start, worker, nodeid = line.split("\t")
            rows.append((float(cpu), float(wall), float(start), worker, nodeid))
    if not rows:
        return f"no cpu_*.tsv in {folder}"
    t0 = min(r[2] for r in rows)
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [f"{len(rows)} items, {total:.0f} CPU seconds in all (items' trees; the workers' start-up not included)"]
    lines.append("   cpu s  share   wall s  start s  worker  item")
    for cpu, wall, start, worker, nodeid in rows[:top]:
        lines.append(f"{cpu:8.1f} {cpu / max(total, 1e-9):6.1%} {wall:8.1f} {start - t0:8.1f}  {worker:6}  {nodeid}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
