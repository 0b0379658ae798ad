"""A real Lightning Trainer (2 DDP processes on CPU, gloo) resumes mid-epoch exactly, and checks it.

The training script is ``examples/05_lightning.py``: no ``set_epoch`` anywhere, a
``StreamingDataLoader`` with a worker, a checkpoint every 9 steps (written by rank 0 only), the
``LoaderPositionCheck`` callback and a ``ResumeAudit`` line in ``training_step``. Separate jobs
run it: uninterrupted for 2 epochs; killed with SIGKILL (both ranks) at step 11; resumed from
the step-9 checkpoint by a fresh Trainer, which passes the check; and resumed from the same
checkpoint with the loader's state taken out, which the check stops naming both positions.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from shardstream import ResumeAudit
from tests.scripts import run_script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "05_lightning.py"


def _run(
    tmp_path: pathlib.Path, out: str, *extra: str, status: int = 0
) -> subprocess.CompletedProcess:
    (tmp_path / out).mkdir()
    command = [sys.executable, str(SCRIPT), "--data", str(tmp_path / "data")]
    command += ["--out", str(tmp_path / out), "--audit", str(tmp_path / f"audit-{out}"), *extra]
    done = run_script(command, timeout=280, cwd=tmp_path)  # the kill takes the script's group
    assert done.returncode == status, done.stderr[-4000:]
    return done


def _steps(tmp_path: pathlib.Path, out: str) -> dict[int, dict[int, list[str]]]:
    steps: dict[int, dict[int, list[str]]] = {}
    for rank in range(2):
        lines = (tmp_path / out / f"keys-rank{rank}.jsonl").read_text().splitlines()
        steps[rank] = {record["step"]: record["keys"] for record in map(json.loads, lines)}
    return steps


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_lightning_ddp_resumes_mid_epoch_exactly_after_sigkill(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        example = __import__("05_lightning")
    finally:
        sys.path.remove(str(SCRIPT.parent))
    example.make_data(tmp_path / "data")
    _run(tmp_path, "full")
    _run(tmp_path, "killed", "--kill-at", "11", status=-signal.SIGKILL)
    (checkpoint,) = (tmp_path / "killed" / "checkpoints").iterdir()
    assert "step=9" in checkpoint.name
    os.rename(tmp_path / "audit-killed", tmp_path / "audit-resumed")  # one job's audit
    _run(tmp_path, "resumed", "--resume", str(checkpoint))
    full, killed, resumed = (_steps(tmp_path, out) for out in ("full", "killed", "resumed"))
    epochs: list[list[list[str]]] = [[], []]  # per epoch, per rank: the keys read
    for rank in range(2):
        assert sorted(full[rank]) == list(range(14))  # 50 samples per rank, batch 8: 7 a epoch
        assert killed[rank] == {s: full[rank][s] for s in range(11)}
        assert resumed[rank] == {s: full[rank][s] for s in range(9, 14)}, f"rank {rank}"
        for epoch in (0, 1):
            steps = range(epoch * 7, epoch * 7 + 7)
            epochs[epoch].append([key for step in steps for key in full[rank][step]])
    for ranks in epochs:  # every epoch: the ranks split the 100 samples between them
        assert not set(ranks[0]) & set(ranks[1]), "ranks read different samples"
        assert len(set(ranks[0]) | set(ranks[1])) == 100
    assert epochs[0] != epochs[1]  # the second epoch moved on to another order
    report = ResumeAudit.report(tmp_path / "audit-resumed", expected=100)
    assert report.restarts == [(1, 9)]
    assert [(e.consumed, e.duplicates, e.skips) for e in report.epochs] == [(100, 0, 0)] * 2

    # The same restart from a checkpoint without the loader's state: the check stops it.
    state = torch.load(checkpoint, weights_only=False)
    del state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    torch.save(state, tmp_path / "no-loader.ckpt")
    failed = _run(tmp_path, "dropped", "--resume", str(tmp_path / "no-loader.ckpt"), status=1)
    assert (
        "ResumeError: the loader is at epoch 0, batch 0 of 7 (0 batches in all), but the "
        "trainer is at epoch 1, batch 2 (Lightning)"
    ) in failed.stderr
