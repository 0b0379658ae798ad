"""Ordering device work between the decode stream and the training step's stream.

A :class:`~.gpudecode.GpuDecode` enqueues a batch's decode, crops and normalisation on a side
stream of its own, so they can run while the training step of the previous batch still runs
on the current stream. Three rules keep that correct (each is a method here):

1. The training step's stream waits for the batch's *event* before it reads the batch
   (:meth:`CudaOrder.wait`): a device-side wait, the host never blocks.
2. Every tensor handed over is marked as used by the training step's stream
   (:meth:`CudaOrder.hand_over`, ``Tensor.record_stream``), so PyTorch's caching allocator does
   not give its memory to the next decode while the step still reads it (the hazard of
   torchvision PR #9606, where ``decode_jpeg`` wrote into memory the caller's stream still read).
3. Memory the decoder owns (nvImageCodec's images, the encoded bytes it reads) is *retired*
   with the batch's event and released only once the event has completed
   (:class:`Retirements`), never while kernels may still read it.

:class:`HostOrder` follows the same protocol on the CPU, where work is synchronous; it records
each call, so the protocol is tested without a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["CudaOrder", "HostOrder", "Retirements", "order_for"]


class CudaOrder:
    """A side stream on one CUDA device and the waits that hand its work over.

    Args:
        device: The CUDA device.
    """

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        """Enqueue the work of the ``with`` block on the side stream."""
        import torch

        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def record(self) -> Any:
        """An event recorded on the side stream after everything enqueued so far."""
        import torch

        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        """Make the current stream (the training step's) wait for ``event`` on the device."""
        import torch

        torch.cuda.current_stream(self.device).wait_event(event)

    def hand_over(self, tensor: Any) -> None:
        """Mark ``tensor``, made on the side stream, as used by the current stream."""
        import torch

        tensor.record_stream(torch.cuda.current_stream(self.device))

    def done(self, event: Any) -> bool:
        """Whether the device has finished the work before ``event`` (no waiting)."""
        return bool(event.query())

    def finish(self, event: Any) -> None:
        """Block until the work before ``event`` is done."""
        event.synchronize()


class HostOrder:
    """The same protocol on the CPU: work is done when enqueued. Records every call.

    Attributes:
        log: ``(method, argument)`` pairs in call order, for tests.
    """

    device: Any = None
    stream: Any = None

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self._events = 0
        self._inside = False

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        self.log.append(("side", None))
        self._inside = True
        try:
            yield
        finally:
            self._inside = False

    def record(self) -> int:
        self._events += 1
        self.log.append(("record", self._events))
        return self._events

    def wait(self, event: int) -> None:
        self.log.append(("wait", event))

    def hand_over(self, tensor: Any) -> None:
        self.log.append(("hand_over", id(tensor)))

    def done(self, event: int) -> bool:
        return True

    def finish(self, event: int) -> None:
        self.log.append(("finish", event))


def order_for(device: Any) -> CudaOrder | HostOrder:
    """A :class:`CudaOrder` for a CUDA device, a :class:`HostOrder` for the CPU."""
    return CudaOrder(device) if device.type == "cuda" else HostOrder()


class Retirements:
    """Objects kept alive until the device work that reads them has finished.

    Args:
        order: The stream order whose events say when work is done.
    """

    def __init__(self, order: CudaOrder | HostOrder) -> None:
        self.order = order
        self._queue: collections.deque[tuple[Any, list[Any]]] = collections.deque()
        # The stage's thread retires; the training thread may release all (close()).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(objects) for _, objects in self._queue)

    def retire(self, event: Any, objects: list[Any]) -> None:
        """Keep ``objects`` until ``event`` completes, then release them."""
        with self._lock:
            self._queue.append((event, objects))
        self.release_done()

    def release_done(self) -> None:
        """Release the objects of every completed event, oldest first."""
        with self._lock:
            while self._queue and self.order.done(self._queue[0][0]):
                self._queue.popleft()

    def release_all(self) -> None:
        """Wait for every pending event, then release everything."""
        with self._lock:
            while self._queue:
                event, _ = self._queue.popleft()
                self.order.finish(event)
