"""Benchmark harness: every stage side by side with eager, torch.compile, the upstream implementation and the
hardware floor, plus cold start, memory, streaming and throughput.

`python -m bench --out bench/results` measures (one subprocess per stage), `python -m bench report` writes
BENCHMARKS.md from bench/results/*/*.json. Only GPU results are published; CPU runs are smoke tests."""

RESULTS_SCHEMA = 1
