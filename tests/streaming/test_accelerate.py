"""Hugging Face accelerate: the README's recipe trains, checkpoints the loader and resumes."""

from __future__ import annotations

import pathlib

import pytest
import torch

from shardstream import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import make_dataset

OPTIONS = StreamOptions(output="dict", shuffle_buffer=8, num_open=3, piece_size=3)


def _setup(root: pathlib.Path):  # type: ignore[no-untyped-def]
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    # The loader is not prepared: each process already reads only its own share.
    loader = StreamingDataLoader(StreamingDataset(root, batch_size=4, options=OPTIONS))
    accelerator.register_for_checkpointing(loader)
    return accelerator, model, optimizer, loader


def _step(accelerator, model, optimizer, batch: dict) -> None:  # type: ignore[no-untyped-def]
    features = torch.zeros(len(batch["label"]), 4)
    loss = torch.nn.functional.cross_entropy(model(features), batch["label"])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:accelerate")
@pytest.mark.filterwarnings("ignore::FutureWarning:accelerate")
def test_accelerate_checkpoints_and_resumes_the_loader(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    accelerator, model, optimizer, loader = _setup(root)
    full = []
    for batch in loader:
        _step(accelerator, model, optimizer, batch)
        full.append(batch["__key__"])
        if len(full) == 4:
            accelerator.save_state(str(tmp_path / "state"))
    accelerator, model, optimizer, loader = _setup(root)
    accelerator.load_state(str(tmp_path / "state"))
    rest = [batch["__key__"] for batch in loader]
    assert rest == full[4:] and len(full) == len(loader) == 10
