"""A real Lightning Trainer (2 DDP processes on CPU, gloo) resumes mid-epoch exactly.

The training script is ``examples/05_lightning.py``: no ``set_epoch`` anywhere, a
``StreamingDataLoader`` with a worker, a checkpoint every 9 steps (written by rank 0 only).
Three separate jobs run it: uninterrupted for 2 epochs, stopped at step 9 (mid-epoch 1), and
resumed from that checkpoint by a fresh Trainer.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "05_lightning.py"


def _run(tmp_path: pathlib.Path, out: str, *extra: str) -> dict[int, dict[int, list[str]]]:
    (tmp_path / out).mkdir()
    command = [sys.executable, str(SCRIPT), "--data", str(tmp_path / "data")]
    command += ["--out", str(tmp_path / out), *extra]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    steps: dict[int, dict[int, list[str]]] = {}
    for rank in range(2):
        lines = (tmp_path / out / f"keys-rank{rank}.jsonl").read_text().splitlines()
        steps[rank] = {record["step"]: record["keys"] for record in map(json.loads, lines)}
    return steps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lightning_ddp_resumes_mid_epoch_exactly(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        example = __import__("05_lightning")
    finally:
        sys.path.remove(str(SCRIPT.parent))
    example.make_data(tmp_path / "data")
    full = _run(tmp_path, "full")
    stopped = _run(tmp_path, "stopped", "--max-steps", "9")
    (checkpoint,) = (tmp_path / "stopped" / "checkpoints").iterdir()
    assert "step=9" in checkpoint.name
    resumed = _run(tmp_path, "resumed", "--resume", str(checkpoint))
    epochs: list[list[list[str]]] = [[], []]  # per epoch, per rank: the keys read
    for rank in range(2):
        assert sorted(full[rank]) == list(range(14))  # 50 samples per rank, batch 8: 7 a epoch
        assert stopped[rank] == {s: full[rank][s] for s in range(9)}
        assert resumed[rank] == {s: full[rank][s] for s in range(9, 14)}, f"rank {rank}"
        for epoch in (0, 1):
            steps = range(epoch * 7, epoch * 7 + 7)
            epochs[epoch].append([key for step in steps for key in full[rank][step]])
    for ranks in epochs:  # every epoch: the ranks split the 100 samples between them
        assert not set(ranks[0]) & set(ranks[1]), "ranks read different samples"
        assert len(set(ranks[0]) | set(ranks[1])) == 100
    assert epochs[0] != epochs[1]  # the second epoch moved on to another order
    assert os.path.getsize(checkpoint) > 0
