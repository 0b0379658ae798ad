"""Hugging Face accelerate: the README's recipe trains, checkpoints the loader and resumes.

``accelerator.step`` counts the batches of ``accumulate()`` and is saved with ``save_state``,
so ``check_position(loader, accelerator.step)`` after ``load_state`` passes, and fails (naming
both positions) when the checkpoint lacks the loader's state.
"""

from __future__ import annotations

import pathlib
import shutil

import pytest
import torch

from shardstream import (
    ResumeError,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    check_position,
)
from tests.streaming.shards import make_dataset

OPTIONS = StreamOptions(output="dict", shuffle_buffer=8, num_open=3, piece_size=3)


def _setup(root: pathlib.Path, register: bool = True):  # type: ignore[no-untyped-def]
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    # The loader is not prepared: each process already reads only its own share.
    loader = StreamingDataLoader(StreamingDataset(root, batch_size=4, options=OPTIONS))
    if register:
        accelerator.register_for_checkpointing(loader)
    return accelerator, model, optimizer, loader


def _step(accelerator, model, optimizer, batch: dict) -> None:  # type: ignore[no-untyped-def]
    with accelerator.accumulate(model):
        features = torch.zeros(len(batch["label"]), 4)
        loss = torch.nn.functional.cross_entropy(model(features), batch["label"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:accelerate")
@pytest.mark.filterwarnings("ignore::FutureWarning:accelerate")
def test_accelerate_checkpoints_resumes_and_checks_the_loader(tmp_path: pathlib.Path) -> None:
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
    assert accelerator.step == 4  # batches through accumulate(), restored with the state
    check_position(loader, accelerator.step)
    rest = [batch["__key__"] for batch in loader]
    assert rest == full[4:] and len(full) == len(loader) == 10
    # The same restart from a checkpoint without the loader's state (nor the loader registered).
    shutil.copytree(tmp_path / "state", tmp_path / "dropped")
    (loader_state,) = (tmp_path / "dropped").glob("custom_checkpoint_*")
    loader_state.unlink()
    accelerator, model, optimizer, loader = _setup(root, register=False)
    accelerator.load_state(str(tmp_path / "dropped"))
    with pytest.raises(ResumeError, match=r"epoch 0, batch 0 of 10 .* step 4 \(4 batches\)"):
        check_position(loader, accelerator.step)
