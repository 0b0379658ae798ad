"""The GPU stage beside the training step: batches decoded ahead on a thread of the stage.

``GpuDecode(ahead=N)`` (the default, N=2) submits batches ``k + 1 .. k + N`` on its own thread
while the training thread holds batch ``k``; the training thread only waits on a batch's event
and takes it. Run here with ``device="cpu"`` (the same stage, :class:`HostOrder` for the
stream protocol): the thread's lifecycle, the order, errors at their batch, a clean stop, and
the loader's state counting only the batches handed out. The CUDA half is in
``test_gpu_decode_cuda.py``.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torchvision.transforms import v2

from shardstream import ConfigError, DecodeError, GpuDecode, StreamingDataLoader, StreamingDataset
from shardstream.streaming._decoding.gpudecode import HostOrder, Retirements
from tests.conftest import encode_image, write_image_folder
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import make_dataset

THREAD = "shardstream-gpu-decode"


def _crop_flip(size: int = 16) -> v2.Compose:
    return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])


@pytest.fixture
def images(tmp_path: pathlib.Path) -> pathlib.Path:
    write_image_folder(tmp_path / "images", num_classes=2, per_class=24, size=(40, 32))
    from shardstream import build_shards

    build_shards(tmp_path / "images", tmp_path / "ds", max_samples_per_shard=8)
    return tmp_path / "ds"


def _encoded_batches(root: pathlib.Path, stage: GpuDecode, **kw: Any) -> tuple[Any, list[Any]]:
    dataset = StreamingDataset(
        root, batch_size=4, shuffle=False, transform=_crop_flip(), decode=stage, **kw
    )
    raw = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0))
    assert dataset.gpu_decode is not None
    return dataset.gpu_decode, raw


class _ThreadedOrder(HostOrder):
    """HostOrder that also notes which thread recorded each event and waited on it."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded_on: list[str] = []
        self.waited_on: list[str] = []

    def record(self) -> int:
        self.recorded_on.append(threading.current_thread().name)
        return super().record()

    def wait(self, event: int) -> None:
        self.waited_on.append(threading.current_thread().name)
        super().wait(event)


def _use_order(stage: GpuDecode, order: HostOrder) -> None:
    run = stage._run()
    run.order, run.retired = order, Retirements(order)


def _stage_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD]


def test_the_stage_works_on_its_own_thread_and_the_trainer_only_waits(
    images: pathlib.Path,
) -> None:
    stage, raw = _encoded_batches(images, GpuDecode(device="cpu", ahead=2))
    order = _ThreadedOrder()
    _use_order(stage, order)
    out = list(stage.batches(raw))
    assert len(out) == len(raw) == 12
    assert set(order.recorded_on) == {THREAD}, "device work is enqueued by the stage's thread"
    assert set(order.waited_on) == {threading.current_thread().name}
    waits = [value for name, value in order.log if name == "wait"]
    assert waits == list(range(1, len(raw) + 1)), "handed out in order, each after its event"
    assert not _stage_threads()


def test_the_same_pixels_and_order_as_on_the_training_thread(images: pathlib.Path) -> None:
    torch.manual_seed(0)
    stage, raw = _encoded_batches(images, GpuDecode(device="cpu", ahead=0))
    serial = [images.clone() for images, _ in stage.batches(raw)]
    threaded = [images for images, _ in GpuDecode(device="cpu", ahead=3).batches(raw)]
    assert len(serial) == len(threaded)
    assert all(torch.equal(a, b) for a, b in zip(serial, threaded, strict=True))


def test_batches_are_decoded_ahead_while_the_trainer_holds_one(images: pathlib.Path) -> None:
    stage, raw = _encoded_batches(images, GpuDecode(device="cpu", ahead=2))
    order = _ThreadedOrder()
    _use_order(stage, order)
    pulled: list[int] = []

    def source() -> Iterator[Any]:
        for number, batch in enumerate(raw):
            pulled.append(number)
            yield batch

    batches = stage.batches(source())
    next(batches)  # the trainer holds batch 0 and does not ask for more
    deadline = time.monotonic() + 10
    while len(order.recorded_on) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # would it run further than asked?
    assert len(order.recorded_on) == 4, "batches 1-2 queued and batch 3 made, no more"
    assert len(pulled) == 4
    batches.close()
    assert not _stage_threads()


def _with_corrupt(tmp_path: pathlib.Path, bad: int) -> pathlib.Path:
    from shardstream import build_shards

    samples = []
    for index in range(16):
        data = encode_image(40, 32, index)
        if index == bad:
            data = data[:200] + bytes(range(256)) * 4
        samples.append({"__key__": f"s{index:02d}", "jpg": data, "cls": index})
    build_shards(samples, tmp_path / "bad", max_samples_per_shard=16, shuffle=False)
    return tmp_path / "bad"


def test_an_error_is_raised_on_the_training_thread_at_its_batch(tmp_path: pathlib.Path) -> None:
    root = _with_corrupt(tmp_path, bad=9)  # in the third batch of four
    dataset = StreamingDataset(
        root, batch_size=4, shuffle=False, transform=_crop_flip(), decode=GpuDecode(device="cpu")
    )
    handed = []
    with pytest.raises(DecodeError, match=r"key 's09'") as raised:
        for _, labels in StreamingDataLoader(dataset, num_workers=1):
            handed.append(labels.tolist())
    assert handed == [[0, 1, 2, 3], [4, 5, 6, 7]], "every batch before it, none after"
    assert raised.value.__traceback__ is not None
    assert not _stage_threads()


@pytest.mark.parametrize("how", ["break", "exception"])
def test_stopping_with_batches_in_flight_stops_the_thread(images: pathlib.Path, how: str) -> None:
    stage, raw = _encoded_batches(images, GpuDecode(device="cpu", ahead=3))
    closed = threading.Event()

    def source() -> Iterator[Any]:
        try:
            yield from raw
        finally:
            closed.set()

    batches = stage.batches(source())
    try:
        for number, _ in enumerate(batches):
            if number == 1:
                if how == "break":
                    break
                raise KeyError("the training step failed")
    except KeyError:
        pass
    batches.close()  # what the loader's generator does when its loop ends early
    assert closed.wait(5), "the source was closed (its finally ran)"
    assert not _stage_threads()
    stage.close()  # waits for work in flight: nothing is left
    assert len(stage._run().retired) == 0


@pytest.mark.slow
def test_interpreter_exit_with_batches_in_flight(images: pathlib.Path) -> None:
    code = f"""
import torch
from torchvision.transforms import v2
from shardstream import GpuDecode, StreamingDataLoader, StreamingDataset
t = v2.Compose([v2.RandomResizedCrop(16, antialias=True)])
ds = StreamingDataset({str(images)!r}, batch_size=4, transform=t,
                      decode=GpuDecode(device="cpu", ahead=4))
batches = iter(StreamingDataLoader(ds, num_workers=2, persistent_workers=True))
next(batches)
print("left with batches in flight")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "left with batches in flight" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_the_loader_state_counts_only_batches_handed_out(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make() -> StreamingDataLoader:
        from shardstream import StreamOptions

        dataset = StreamingDataset(
            root, seed=5, batch_size=3, transform=_crop_flip(8),
            options=StreamOptions(output="dict", num_open=3, piece_size=3, block_size=4),
            decode=GpuDecode(device="cpu", ahead=4),
        )  # fmt: skip
        return StreamingDataLoader(dataset, num_workers=2, persistent_workers=True)

    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]), seed=3)


def test_ahead_is_checked() -> None:
    with pytest.raises(ConfigError, match="ahead must be 0 or more"):
        GpuDecode(device="cpu", ahead=-1)


def test_a_break_stops_the_stage_and_the_thread_loader_it_pulls_from(
    images: pathlib.Path,
) -> None:
    """With ``num_threads`` the stage's thread pulls batches from the loader's threads; a
    ``break`` used to close those while the stage's thread was inside them ('generator already
    executing')."""

    class Slow(StreamingDataset):
        def __iter__(self) -> Iterator[Any]:
            for batch in super().__iter__():
                time.sleep(1.0)  # the stage's thread waits inside the thread loader
                yield batch

    dataset = Slow(
        images, batch_size=4, transform=_crop_flip(), decode=GpuDecode(device="cpu", ahead=1)
    )
    batches = iter(StreamingDataLoader(dataset, num_threads=2))
    next(batches)
    time.sleep(0.3)
    batches.close()  # what a break does
    assert not _stage_threads()
    assert not [t for t in threading.enumerate() if t.name.startswith("shardstream-worker-")]
