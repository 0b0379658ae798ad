"""Exact validation with a Lightning Trainer on 2 CPU processes (DDP, gloo).

``val_dataloader`` returns a ``policy="mask"`` dataset; ``validation_step`` updates a
torchmetrics accuracy with ``preds[valid], labels[valid]`` and logs the metric object, which
Lightning computes over both ranks at the end. ``trainer.validate`` then reports the
single-process accuracy exactly.

Run: python examples/08_lightning_eval.py   (makes data, validates on 2 processes and in one)
     python examples/08_lightning_eval.py --data D --out O
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings

import torch.distributed
from torchmetrics import SumMetric
from torchmetrics.classification import MulticlassAccuracy

from shardstream import StreamingDataLoader, StreamingDataset

warnings.filterwarnings("ignore", module="lightning")  # its notes on CPU-only and small data
import lightning as L  # noqa: E402  (after the filter: some notes come at import)

HERE = pathlib.Path(__file__).resolve().parent
#: The data and the fixed "model" of the torchrun example.
_spec = importlib.util.spec_from_file_location("exact_eval", HERE / "07_exact_eval.py")
assert _spec is not None and _spec.loader is not None
exact_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exact_eval)


class Evaluated(L.LightningModule):
    def __init__(self, data: str) -> None:
        super().__init__()
        self.data = data
        self.accuracy = MulticlassAccuracy(num_classes=exact_eval.NUM_CLASSES, average="micro")
        self.counted = SumMetric()

    def val_dataloader(self) -> StreamingDataLoader:
        # Created here, after Lightning set up torch.distributed: each rank reads its share.
        dataset = StreamingDataset(self.data, batch_size=64, shuffle=False, policy="mask")
        return StreamingDataLoader(dataset, num_workers=1)

    def validation_step(self, batch: tuple, index: int) -> None:
        images, labels, valid = batch
        self.accuracy.update(exact_eval.predict(images)[valid], labels[valid])
        self.counted.update(valid.sum())
        self.log("val_acc", self.accuracy)  # a metric object: computed over all ranks
        self.log("val_samples", self.counted, reduce_fx="sum")


def validate(data: str, out: str) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    (result,) = trainer.validate(Evaluated(data))
    path = pathlib.Path(out, f"rank{trainer.global_rank}.json")
    path.write_text(json.dumps({name: float(value) for name, value in result.items()}))
    if torch.distributed.is_initialized():  # leave together (see examples/05_lightning.py)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.data:  # one run (Lightning's own DDP launcher comes here too)
        validate(args.data, args.out)
        return
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    exact_eval.build_shards(exact_eval.make_samples(), work / "data", max_samples_per_shard=100)
    (work / "out").mkdir(exist_ok=True)
    command = [sys.executable, __file__, "--data", str(work / "data"), "--out", str(work / "out")]
    subprocess.run(command, check=True)
    single = exact_eval.evaluate(str(work / "data"), "mask")  # one process, no Lightning
    ranks = [json.loads((work / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    for result in ranks:
        assert result["val_acc"] == single["accuracy"], (result, single)
        assert result["val_samples"] == single["samples"] == exact_eval.NUM_SAMPLES
    print(f"Lightning validate on 2 ranks: {ranks[0]['val_samples']:.0f} samples, accuracy "
          f"{ranks[0]['val_acc']!r} (single process {single['accuracy']!r})")  # fmt: skip


if __name__ == "__main__":
    main()
