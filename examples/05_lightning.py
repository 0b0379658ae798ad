"""Train with a Lightning Trainer on 2 CPU processes (DDP, gloo); resume mid-epoch exactly.

No ``set_epoch`` anywhere: each epoch reads a new order by itself. ``StreamingDataLoader`` has
``state_dict``/``load_state_dict``, so Lightning stores its position in every checkpoint (from
rank 0; the state is the same on every rank) and restores it on ``fit(ckpt_path=...)``. The
``LoaderPositionCheck`` callback fails the resumed fit at its first batch if the loader is not
where the trainer is, and ``ResumeAudit`` records each step's keys (one line in
``training_step``) to count duplicates and skips across the restart.

Run: python examples/05_lightning.py            (makes data, trains 2 epochs, is killed with
                                                 SIGKILL at step 11, resumes from the step-9
                                                 checkpoint, and checks the resumed batches)
     python examples/05_lightning.py --data D --out O [--max-steps N] [--kill-at N]
                                     [--resume CKPT] [--audit DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import warnings

import torch

from shardstream import (
    ResumeAudit,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
)

warnings.filterwarnings("ignore", module="lightning")  # its notes on CPU-only and small data
import lightning as L  # noqa: E402  (after the filter: some notes come at import)

from shardstream import LoaderPositionCheck  # noqa: E402

BATCH_SIZE, STEPS_PER_CHECKPOINT, KILL_AT = 8, 9, 11


class TinyModel(L.LightningModule):
    def __init__(self, data: str, out: str, audit: str, kill_at: int) -> None:
        super().__init__()
        self.data, self.out, self.kill_at = data, pathlib.Path(out), kill_at
        self.audit_folder, self.audit = audit, None
        self.net = torch.nn.Linear(4, 3)

    def train_dataloader(self) -> StreamingDataLoader:
        # Created here, after Lightning set up torch.distributed: each rank reads its share.
        dataset = StreamingDataset(
            self.data, batch_size=BATCH_SIZE, decode="raw", options=StreamOptions(output="dict")
        )
        return StreamingDataLoader(dataset, num_workers=1)

    def training_step(self, batch: dict, index: int) -> torch.Tensor:
        if self.global_step == self.kill_at:  # the first rank there kills both: a crash
            os.killpg(os.getpgid(0), signal.SIGKILL)  # (neither has logged this step yet)
        if self.audit is None:  # made once torch.distributed is up: it knows the rank
            self.audit = ResumeAudit(self.audit_folder)
        self.audit.record(self.global_step, batch, self.current_epoch)
        rows = [torch.frombuffer(bytearray(row), dtype=torch.float32) for row in batch["bin"]]
        features = torch.stack(rows)
        loss = torch.nn.functional.cross_entropy(self.net(features), batch["label"])
        record = {"step": self.global_step, "epoch": self.current_epoch, "keys": batch["__key__"]}
        with open(self.out / f"keys-rank{self.global_rank}.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_data(root: pathlib.Path) -> None:
    generator = torch.Generator().manual_seed(0)
    samples = (
        {"__key__": f"s{i:04d}", "bin": torch.rand(4, generator=generator).numpy().tobytes(),
         "cls": i % 3}
        for i in range(100)
    )  # fmt: skip
    build_shards(samples, root, max_samples_per_shard=16)


def train(
    data: str, out: str, max_steps: int, resume: str | None, audit: str, kill_at: int
) -> None:
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out, "checkpoints"), every_n_train_steps=STEPS_PER_CHECKPOINT,
        save_top_k=-1, save_on_train_epoch_end=False,
    )  # fmt: skip
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, max_steps=max_steps,
        callbacks=[checkpoints, LoaderPositionCheck()], logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(TinyModel(data, out, audit, kill_at), ckpt_path=resume)
    # Leave together: Lightning destroys the process group at exit, rank by rank, and a rank
    # that destroys it while another is still ending can hang (pytorch/pytorch#75097).
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def read_steps(out: pathlib.Path, rank: int) -> dict[int, list[str]]:
    lines = (out / f"keys-rank{rank}.jsonl").read_text().splitlines()
    return {record["step"]: record["keys"] for record in map(json.loads, lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data")
    parser.add_argument("--out")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--resume")
    parser.add_argument("--audit")
    args = parser.parse_args()
    if args.data:  # one run (the test and Lightning's own DDP launcher come here)
        audit = args.audit or os.path.join(args.out, "audit")
        train(args.data, args.out, args.max_steps, args.resume, audit, args.kill_at)
        return
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    make_data(work / "data")
    audit = str(work / "audit")  # the killed run and its restart, as one training job
    runs = {"full": [], "killed": ["--kill-at", str(KILL_AT), "--audit", audit], "resumed": []}
    for name, extra in runs.items():  # each run its own job, as after a real restart
        (work / name).mkdir(parents=True, exist_ok=True)
        if name == "resumed":
            (checkpoint,) = (work / "killed" / "checkpoints").iterdir()
            extra = ["--resume", str(checkpoint), "--audit", audit]
        command = [sys.executable, __file__, "--data", str(work / "data")]
        command += ["--out", str(work / name), *extra]
        done = subprocess.run(command, start_new_session=True)  # the kill takes its group
        assert done.returncode == (-signal.SIGKILL if name == "killed" else 0), name
    for rank in range(2):
        full, resumed = read_steps(work / "full", rank), read_steps(work / "resumed", rank)
        assert len(full) == 14 and list(resumed) == list(range(STEPS_PER_CHECKPOINT, 14))
        assert resumed == {step: keys for step, keys in full.items() if step in resumed}
        first = [key for step in range(7) for key in full[step]]
        second = [key for step in range(7, 14) for key in full[step]]
        assert first != second and sorted(first) == sorted(second), "epochs must differ"
    report = ResumeAudit.report(audit, expected=100)
    assert all((e.duplicates, e.skips) == (0, 0) for e in report.epochs), report
    print(f"killed at step {KILL_AT}, resumed at step {STEPS_PER_CHECKPOINT}: every rank saw the")
    print(f"uninterrupted batches; resume audit:\n{report}")


if __name__ == "__main__":
    main()
