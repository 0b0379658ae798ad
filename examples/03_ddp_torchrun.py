"""DDP training on CPU with torchrun: 2 ranks (gloo), a tiny model, a few steps per epoch.

Run: python examples/03_ddp_torchrun.py   (launches itself with torchrun --nproc-per-node 2)
"""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image

from shardstream import StreamingDataLoader, StreamingDataset, build_shards


def make_samples(count: int = 101) -> list[dict]:  # 101: uneven on purpose, no rank may hang
    rng = np.random.default_rng(0)
    samples = []
    for index in range(count):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
        samples.append({"__key__": f"s{index:04d}", "png": buffer.getvalue(), "cls": index % 2})
    return samples


def train(data: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = StreamingDataset(data, batch_size=10, decode="rgb8")
    loader = StreamingDataLoader(ds, num_workers=1)
    for epoch in range(2):
        ds.set_epoch(epoch)
        steps = 0
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        if rank == 0:
            print(f"epoch {epoch}: {steps} steps per rank (len {len(ds)}), loss {loss.item():.3f}")
    dist.barrier()  # let every rank finish talking before any tears its process group down
    dist.destroy_process_group()


def main() -> None:
    if "LOCAL_RANK" in os.environ:
        train(sys.argv[1])
        return
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "data", max_samples_per_shard=30)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        str(work / "data"),
    ]
    subprocess.run(command, check=True)
    print("DDP run finished on 2 ranks")


if __name__ == "__main__":
    main()
