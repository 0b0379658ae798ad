"""A torchrun loop (2 ranks, gloo) that checks its resume and audits it.

Three jobs of the same script: one killed with SIGKILL at step 7; one restarted from its last
checkpoint (step 5), where ``check_position`` passes and the ``ResumeAudit`` counts over both
jobs no duplicate but ``pad``'s own repeat and no skip; and one restarted from the same
checkpoint whose loader's state was left out (as a wrapper that drops it would), which
``check_position`` stops with both positions instead of training silently on wrong samples.

Run: python examples/09_checked_resume.py   (launches itself with torchrun --nproc-per-node 2)
     torchrun --nproc-per-node 2 examples/09_checked_resume.py DATA OUT [--kill-at N]
                                          [--resume CKPT] [--drop-loader-state]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist

from shardstream import (
    ResumeAudit,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    check_position,
)

EPOCHS, CHECKPOINT_EVERY, KILL_AT, NUM_SAMPLES = 2, 5, 7, 101


def make_samples() -> list[dict]:  # 101: uneven on purpose, no rank may hang
    rng = np.random.default_rng(0)
    return [
        {"__key__": f"s{index:04d}", "npy": rng.random(4).astype(np.float32), "cls": index % 2}
        for index in range(NUM_SAMPLES)
    ]


def train(data: str, out: pathlib.Path, kill_at: int, resume: str | None, drop: bool) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = StreamingDataset(data, batch_size=4, options=StreamOptions(output="dict"))
    loader = StreamingDataLoader(dataset, num_workers=1)
    step = 0
    if resume:
        checkpoint = torch.load(resume, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = checkpoint["step"]
        if not drop:
            loader.load_state_dict(checkpoint["loader"])
        check_position(loader, step)  # raises unless the loader is where the trainer is
    audit = ResumeAudit(out / "audit")
    for epoch in range(loader.position().epoch, EPOCHS):
        for batch in loader:
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a crash, on every rank at once
            audit.record(step, batch, epoch)
            features = torch.from_numpy(np.stack(batch["npy"]))
            loss = torch.nn.functional.cross_entropy(model(features), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % CHECKPOINT_EVERY == 0 and dist.get_rank() == 0:
                saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step, "loader": loader.state_dict()}  # fmt: skip
                torch.save(saved, out / "checkpoint.tmp")
                os.replace(out / "checkpoint.tmp", out / "checkpoint.pt")
    dist.barrier()  # let every rank finish talking before any tears its process group down
    dist.destroy_process_group()


def launch(data: pathlib.Path, out: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", __file__, str(data), str(out), *extra]
    return subprocess.run(command, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data", nargs="?")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--resume")
    parser.add_argument("--drop-loader-state", action="store_true")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        out = pathlib.Path(args.out)
        train(args.data, out, args.kill_at, args.resume, args.drop_loader_state)
        return
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "data", max_samples_per_shard=30)
    killed = launch(work / "data", work, "--kill-at", str(KILL_AT))
    assert killed.returncode != 0 and "(SIGKILL)" in killed.stderr, killed.stderr[-2000:]
    resumed = launch(work / "data", work, "--resume", str(work / "checkpoint.pt"))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    report = ResumeAudit.report(work / "audit", expected=NUM_SAMPLES)
    # One duplicate per epoch: policy="pad" repeats 1 of 101 samples for 2 ranks, restart or
    # not. The restart itself added none and skipped none.
    assert [(e.duplicates, e.skips) for e in report.epochs] == [(1, 0)] * EPOCHS, report
    print(f"killed at step {KILL_AT}, resumed from step {CHECKPOINT_EVERY}; resume audit (the "
          "1 duplicate per epoch is pad's repeat):")  # fmt: skip
    print(report)
    (work / "dropped").mkdir(exist_ok=True)
    dropped = launch(
        work / "data", work / "dropped", "--resume", str(work / "checkpoint.pt"),
        "--drop-loader-state",
    )  # fmt: skip
    assert dropped.returncode != 0
    lines = [line for line in dropped.stderr.splitlines() if "ResumeError:" in line]
    (message,) = {line.split("ResumeError:", 1)[1].strip() for line in lines}  # every rank's
    assert len(lines) == 2, dropped.stderr[-4000:]
    print(f"without the loader's state, every rank stops: ResumeError: {message}")


if __name__ == "__main__":
    main()
