"""NVIDIA DALI's CPU pipeline as a loading contender (``benchmarks/load.py``, train mode).

DALI reads the same WebDataset shards, but needs its own index per tar (not shardstream's
``.idx``): ``v1.2 <num_samples>``, then one line per sample listing each member as
``<ext> <data_offset> <size> <member_name>``. :func:`write_dali_indexes` writes them into a
separate folder of the benchmark's data (the same bytes as DALI's own ``wds2idx`` tool).

The pipeline does the work of the other train rows: decode with a random crop (DALI decodes only
the crop window), bilinear antialiased resize to 224x224, random horizontal flip, conversion to
float and ImageNet normalisation, CHW layout; labels are parsed from the ``.cls`` text. It runs
on the CPU only (``device_id=None``), with ``num_threads`` worker threads.
"""

from __future__ import annotations

import tarfile
import time
from pathlib import Path
from typing import Any

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def dali_version() -> str | None:
    """DALI's version when ``nvidia.dali`` imports, else None."""
    try:
        import nvidia.dali as dali
    except Exception:
        return None
    return str(getattr(dali, "__version__", "?"))


def write_dali_index(tar_path: Path, index_path: Path) -> None:
    """Write DALI's index of one uncompressed tar (samples = members sharing a basename)."""
    samples: list[list[str]] = []
    last = None
    with tarfile.open(tar_path, "r:") as tar:
        for member in tar:
            if not member.isreg():
                continue
            name = member.name
            dot = name.find(".", name.rfind("/") + 1)
            if dot <= 0 or name[:dot].endswith("/"):
                continue
            base = name[:dot]
            entry = f"{name[dot + 1 :]} {member.offset_data} {member.size} {name}"
            if base != last:
                samples.append([entry])
                last = base
            else:
                samples[-1].append(entry)
    partial = index_path.with_suffix(".partial")
    with open(partial, "w") as stream:
        stream.write(f"v1.2 {len(samples)}\n")
        stream.writelines(" ".join(sample) + "\n" for sample in samples)
    partial.replace(index_path)


def write_dali_indexes(shards: Path, index_dir: Path) -> tuple[list[str], list[str]]:
    """Index every ``shard-*.tar`` of ``shards`` into ``index_dir`` (only when missing or stale).

    Returns:
        ``(tar paths, index paths)``, sorted, in matching order.
    """
    index_dir.mkdir(parents=True, exist_ok=True)
    tars = sorted(shards.glob("shard-*.tar"))
    indexes = []
    for tar in tars:
        index = index_dir / (tar.stem + ".dali.idx")
        if not index.exists() or index.stat().st_mtime < tar.stat().st_mtime:
            write_dali_index(tar, index)
        indexes.append(index)
    return [str(t) for t in tars], [str(i) for i in indexes]


def build_pipeline(
    tars: list[str], indexes: list[str], batch: int, threads: int, gpu: bool = False
) -> Any:
    """The train pipeline on the CPU, or with ``gpu`` on GPU 0: the mixed (nvJPEG) decoder
    with its random crop, then GPU resize and crop-mirror-normalize (``benchmarks/gpu.py``)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def train() -> Any:
        jpegs, labels = fn.readers.webdataset(
            paths=tars,
            index_paths=indexes,
            ext=["jpg", "cls"],
            missing_component_behavior="error",
            random_shuffle=True,
            initial_fill=1000,  # the shuffle buffer of the other loaders
            name="Reader",
        )
        images = fn.decoders.image_random_crop(
            jpegs,
            device="mixed" if gpu else "cpu",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
            num_attempts=10,
        )
        images = fn.resize(
            images, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR, antialias=True
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[255 * m for m in MEAN],
            std=[255 * s for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        if gpu:  # ".cls" text of 1-3 digits, padded so DALI's PyTorch iterator gets one tensor
            labels = fn.pad(labels, axes=[0], shape=[8], fill_value=0)
        return images, labels

    pipe = train(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=0)
    pipe.build()
    return pipe


def run_dali_epoch(tars: list[str], indexes: list[str], batch: int, threads: int) -> dict:
    """One epoch through DALI's CPU pipeline into torch tensors, like the other loaders deliver.

    Returns:
        ``{"samples", "seconds", "first_s"}``; the time includes building the pipeline (the
        other rows include their worker start-up).
    """
    import numpy as np
    import torch

    start = time.perf_counter()
    pipe = build_pipeline(tars, indexes, batch, threads)
    total = pipe.epoch_size("Reader")
    first, count = None, 0
    while count < total:
        images, labels = pipe.run()
        pixels = torch.from_numpy(images.as_array())  # (batch, 3, 224, 224) float32
        targets = torch.tensor([int(bytes(np.asarray(labels.at(i)))) for i in range(len(labels))])
        assert pixels.shape[0] == targets.shape[0] == batch
        if first is None:
            first = time.perf_counter() - start
        count += min(batch, total - count)  # DALI fills the last batch from the next epoch
    return {"samples": count, "seconds": time.perf_counter() - start, "first_s": first or 0.0}
