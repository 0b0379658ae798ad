"""Collating samples into batches inside the DataLoader workers.

One batch crosses the worker queue as one pickle (and one shared-memory tensor for the images),
instead of one pickle per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["collate_dicts", "collate_pairs", "stack_or_list"]


def stack_or_list(values: Sequence[Any]) -> Any:
    """Stack tensors of equal shape (or numpy arrays) into one tensor; otherwise a list."""
    import torch

    first = values[0] if values else None
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape for v in values
    ):
        return torch.stack(list(values))
    return list(values)


def collate_pairs(pairs: Sequence[tuple[Any, int]]) -> tuple[Any, Any]:
    """``[(image, label), ...]`` -> ``(images, labels)`` with ``labels`` an int64 tensor."""
    import torch

    images = stack_or_list([image for image, _ in pairs])
    labels = torch.tensor([label for _, label in pairs], dtype=torch.int64)
    return images, labels


def collate_dicts(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """List of sample dicts -> dict of batched fields (``label`` a tensor, images stacked)."""
    import torch

    keys = list(samples[0]) if samples else []
    batch: dict[str, Any] = {}
    for key in keys:
        values = [sample.get(key) for sample in samples]
        if key == "label":
            batch[key] = torch.tensor(values, dtype=torch.int64)
        else:
            batch[key] = stack_or_list(values)
    return batch
