"""Small tensors (labels) that cross the DataLoader worker queue inside the pickle."""

from __future__ import annotations

import multiprocessing.reduction
from typing import Any

import torch

__all__ = ["MIN_BYTES", "InlineTensor", "inline", "typed_view"]

MIN_BYTES = 64 * 1024  # smaller batches are cheap to allocate; not worth a shared buffer


class InlineTensor(torch.Tensor):
    """A small tensor (labels, tiny images) that crosses the worker queue inside the pickle.

    PyTorch would put it in a new shared-memory segment and hand its file descriptor over a
    socket: about a millisecond per batch, for a few hundred bytes. Operations on it return
    plain tensors; the receiver gets a plain tensor.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


def inline(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as an :class:`InlineTensor` when it is small (under :data:`MIN_BYTES`)."""
    if tensor.nbytes >= MIN_BYTES or type(tensor) is not torch.Tensor:
        return tensor
    return tensor.as_subclass(InlineTensor)


def _reduce_inline(tensor: InlineTensor) -> Any:
    plain = tensor.as_subclass(torch.Tensor).contiguous()
    data = plain.reshape(-1).view(torch.uint8).numpy().tobytes() if plain.numel() else b""
    return _from_bytes, (data, str(plain.dtype).removeprefix("torch."), tuple(plain.shape))


def _from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return typed_view(flat, getattr(torch, dtype), shape)


def typed_view(flat: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A flat ``uint8`` tensor viewed as ``dtype`` with ``shape`` (no copy)."""
    return flat.view(dtype).view(shape)


multiprocessing.reduction.ForkingPickler.register(InlineTensor, _reduce_inline)
