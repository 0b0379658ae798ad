"""Exact evaluation on 4 ranks (torchrun, gloo): the accuracy equals the single-process one.

``policy="mask"`` gives every rank the same number of batches (so collectives never hang) and
marks the filler entries that even them out: ``(images, labels, valid)``. Updating the metric
with ``preds[valid], labels[valid]`` counts every sample exactly once over all ranks, so the
synchronised torchmetrics accuracy is the single-process accuracy to the last bit. With
``policy="pad"`` (the training default) 3 of the 1,001 samples are counted twice.

Run: python examples/07_exact_eval.py   (launches itself with torchrun --nproc-per-node 4)
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torchmetrics import SumMetric
from torchmetrics.classification import MulticlassAccuracy

from shardstream import StreamingDataLoader, StreamingDataset, build_shards

NUM_SAMPLES, NUM_CLASSES = 1001, 3


def make_samples() -> list[dict]:
    rng = np.random.default_rng(0)
    samples = []
    for index in range(NUM_SAMPLES):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
        samples.append({"__key__": f"s{index:04d}", "png": buffer.getvalue(), "cls": index % 3})
    return samples


def predict(images: torch.Tensor) -> torch.Tensor:
    """A fixed "model": the class from the image's mean brightness."""
    return (images.float().mean(dim=(1, 2, 3)) * 7).long() % NUM_CLASSES


def evaluate(data: str, policy: str) -> dict[str, float]:
    """Accuracy and samples counted over all ranks (torchmetrics syncs at compute)."""
    dataset = StreamingDataset(data, batch_size=64, shuffle=False, policy=policy)
    accuracy = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
    counted = SumMetric()
    for batch in StreamingDataLoader(dataset, num_workers=1):
        images, labels = batch[0], batch[1]
        valid = batch[2] if policy == "mask" else torch.ones(len(labels), dtype=torch.bool)
        accuracy.update(predict(images)[valid], labels[valid])
        counted.update(valid.sum())
    return {"accuracy": float(accuracy.compute()), "samples": int(counted.compute())}


def rank_main(data: str, out: str) -> None:
    dist.init_process_group("gloo")
    results = {policy: evaluate(data, policy) for policy in ("mask", "pad")}
    pathlib.Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()  # let every rank finish talking before any tears its process group down
    dist.destroy_process_group()


def main() -> None:
    if "LOCAL_RANK" in os.environ:
        rank_main(sys.argv[1], sys.argv[2])
        return
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "data", max_samples_per_shard=100)
    (work / "out").mkdir(exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "4", __file__, str(work / "data"), str(work / "out")]
    subprocess.run(command, check=True)
    single = evaluate(str(work / "data"), "mask")  # one process: every sample once
    ranks = [json.loads((work / "out" / f"rank{r}.json").read_text()) for r in range(4)]
    assert single["samples"] == NUM_SAMPLES
    assert all(result["mask"] == single for result in ranks), (ranks, single)
    assert all(result["pad"]["samples"] == 1004 for result in ranks)
    print(f"4 ranks, mask: {ranks[0]['mask']['samples']} samples, accuracy "
          f"{ranks[0]['mask']['accuracy']!r} (single process {single['accuracy']!r})")  # fmt: skip
    print(f"4 ranks, pad: {ranks[0]['pad']['samples']} samples, accuracy "
          f"{ranks[0]['pad']['accuracy']!r}")  # fmt: skip


if __name__ == "__main__":
    main()
