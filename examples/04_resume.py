"""Save the loader's position with a checkpoint, "crash", and resume exactly where it stopped.

Run: python examples/04_resume.py   (writes under $SHARDSTREAM_EXAMPLE_DIR or a temp dir)
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
import torch

from shardstream import StreamingDataLoader, StreamingDataset, StreamOptions, build_shards


def make_samples(count: int = 120) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {"__key__": f"s{index:04d}", "npy": rng.random(4).astype(np.float32), "cls": index % 3}
        for index in range(count)
    ]


def make_loader(root: pathlib.Path) -> tuple[StreamingDataset, StreamingDataLoader]:
    ds = StreamingDataset(root, seed=0, batch_size=8, options=StreamOptions(output="dict"))
    return ds, StreamingDataLoader(ds, num_workers=2)


def main() -> None:
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "data", max_samples_per_shard=25)
    checkpoint = work / "checkpoint.pt"

    ds, loader = make_loader(work / "data")
    ds.set_epoch(3)
    reference = [batch["__key__"] for batch in loader]  # the uninterrupted epoch

    ds, loader = make_loader(work / "data")
    ds.set_epoch(3)
    for step, _batch in enumerate(loader):
        if step == 5:  # save with the model, then "crash"
            torch.save({"step": step, "loader": loader.state_dict()}, checkpoint)
            break

    ds, loader = make_loader(work / "data")  # a new process after the restart
    state = torch.load(checkpoint)["loader"]
    loader.load_state_dict(state)
    ds.set_epoch(state["epoch"])
    resumed = [batch["__key__"] for batch in loader]
    assert resumed == reference[6:], "resume differs from the uninterrupted run"
    print(
        f"saved after {state['consumed_batches']} of {len(ds)} batches in epoch "
        f"{state['epoch']}; resumed run yielded the remaining {len(resumed)} batches exactly"
    )


if __name__ == "__main__":
    main()
