"""Running a script in its own process group, with every process's stacks when it hangs."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


def run_script(
    command: Sequence[str], timeout: float, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """Run ``command`` in a new session (a kill inside takes its group, not pytest).

    When it outlives ``timeout``, every process of its group gets SIGABRT, on which
    ``PYTHONFAULTHANDLER`` prints each Python thread's stack (the script, its DataLoader workers,
    the ranks it launched), and the test fails with the end of what they printed: a hang names
    where it waits instead of only that it timed out.
    """
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        command, cwd=cwd, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGABRT)
        try:
            out, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} ran past {timeout} s; its processes' stacks:\n{err[-20000:]}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)
