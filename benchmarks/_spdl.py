"""SPDL (Meta's thread-pool loader, pypi ``spdl``) as a contender in benchmarks/load.py.

Its pipeline as SPDL's ImageNet example builds it, on the same tar shards: the shard files in a
shuffled order are read whole (one buffer per shard) and split with ``spdl.io.iter_tarfile`` on
a stage of the thread pool; in train mode each image is demuxed and decoded by SPDL's own
decoder (FFmpeg), the crop of ``RandomResizedCrop(224)`` (the same draw as torchvision's) and
the flip applied in the decoder's filter graph; batches are stacked and normalised in one torch
op each. Raw mode hands out the bytes (views of the shard buffer). Everything runs on
``threads`` threads of one process, as SPDL recommends. SPDL's io needs FFmpeg's shared
libraries (``apt-get install libavutil57 libavcodec59 libavformat59 libavfilter8 libswscale6
libswresample4 libavdevice59`` on Debian 12); without them the row reports why it was skipped.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def spdl_version() -> str | None:
    """SPDL's version when it and its FFmpeg libraries load, else None."""
    try:
        from importlib import metadata

        import spdl.io.lib

        spdl.io.lib._import_libspdl()  # loads libspdl and FFmpeg's libraries now
        return metadata.version("spdl")
    except Exception:
        return None


def _crop(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3)."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(*log_ratio))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, width - w), random.randint(0, height - h), w, h
    ratio = width / height  # fallback: the central crop
    if ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif ratio > 4 / 3:
        h, w = height, round(height * (4 / 3))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _read_shard(path: str) -> list[tuple[Any, int]]:
    import spdl.io

    data = Path(path).read_bytes()  # one buffer per shard; members are views of it
    samples: dict[str, dict[str, Any]] = {}
    for name, content in spdl.io.iter_tarfile(data):
        base = name.rsplit("/", 1)[-1]
        key, _, ext = base.partition(".")
        samples.setdefault(key, {})[ext] = content
    return [(s["jpg"], int(bytes(s["cls"]))) for s in samples.values() if "jpg" in s]


def _decode(sample: tuple[Any, int]) -> tuple[Any, int]:
    import spdl.io

    data, label = sample
    packets = spdl.io.demux_image(bytes(data))
    x, y, w, h = _crop(packets.width, packets.height)
    flip = ",hflip" if random.random() < 0.5 else ""
    graph = f"crop={w}:{h}:{x}:{y},scale=224:224:flags=bilinear{flip},format=rgb24"
    frames = spdl.io.decode_packets(packets, filter_desc=graph)
    return spdl.io.to_torch(spdl.io.convert_frames(frames)), label


def _collate_train(samples: list[tuple[Any, int]]) -> tuple[Any, Any]:
    import torch

    images = torch.stack([image for image, _ in samples]).permute(0, 3, 1, 2)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    images = (images.float() - mean) / std
    return images.contiguous(), torch.tensor([label for _, label in samples])


def _collate_raw(samples: list[tuple[Any, int]]) -> tuple[list[Any], Any]:
    import torch

    return [data for data, _ in samples], torch.tensor([label for _, label in samples])


def run_spdl_epoch(shards: str, mode: str, batch: int, threads: int) -> dict:
    """One epoch of SPDL's pipeline: ``{"samples", "seconds", "first_s"}``."""
    from spdl.pipeline import PipelineBuilder

    urls = sorted(str(p) for p in Path(shards).glob("shard-*.tar"))
    random.shuffle(urls)
    start = time.perf_counter()
    builder = PipelineBuilder().add_source(urls)
    builder = builder.pipe(_read_shard, concurrency=threads).disaggregate()
    if mode == "train":
        builder = builder.pipe(_decode, concurrency=threads)
    collate = _collate_train if mode == "train" else _collate_raw
    builder = builder.aggregate(batch, drop_last=False).pipe(collate).add_sink(3)
    pipeline = builder.build(num_threads=threads)
    first, count = None, 0
    with pipeline.auto_stop():
        for _, labels in pipeline:
            if first is None:
                first = time.perf_counter() - start
            count += len(labels)
    return {"samples": count, "seconds": time.perf_counter() - start, "first_s": first or 0.0}
