"""The build's load check, started early: a child process that loads the fresh packages and runs their golden
cases (`ttsaot.runtime.verify`), as `python -m ttsaot.runtime.verify` would, but spawned when the build starts.

The child spends its first seconds importing torch and the runtime, then waits on its stdin for the check to run;
the build sends it once the artifact is written. Its imports so overlap the build's work instead of following it
(a warm rebuild with every package cached otherwise spent about a third of its time starting that process). The
check itself is unchanged: a fresh process, the packages loaded from the new artifact, the environment the build
has at that moment (sent with the request). This module imports no torch, so the CLI can start the child before
the build imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys


class LoadCheck:
    """One child, for one check: `run` it once (or `close` it unused; a child given no request exits)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ttsaot.builder.load_check"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """`python -m ttsaot.runtime.verify ARGV` in the child, with this process's current environment; its exit
        status (negative: killed by that signal) and output. A child past `timeout` is killed."""
        request = json.dumps({"argv": argv, "env": dict(os.environ)}) + "\n"
        try:
            out, err = self.proc.communicate(request, timeout=timeout)
        except BaseException:
            self.close()
            raise
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def ended(self) -> bool:
        """The child has exited: it ran its one check (or died); a further check needs a new LoadCheck."""
        return self.proc.poll() is not None

    def close(self) -> None:
        """Stop the child if it still runs (a build that failed or was interrupted before its check)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.communicate(timeout=30)
        except (ValueError, OSError, subprocess.TimeoutExpired):
            pass  # pipes already closed by a finished `run`

    def __enter__(self) -> LoadCheck:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _child() -> int:
    import torch  # noqa: F401  - the seconds this process is started early for

    from ttsaot.runtime import loader, stage, verify  # noqa: F401

    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the build stopped before its check
    request = json.loads(line)
    os.environ.clear()
    os.environ.update(request["env"])
    return verify.main(request["argv"])


if __name__ == "__main__":
    sys.exit(_child())
