"""Reading slices of one worker stream in its planned order (see ``planning.windows``).

A :class:`StreamCursor` yields stream positions ``[start, stop)`` as samples. It keeps the
current window and each of its runs opened as a piece, positioned at the run's next sample:
reading a stream front to back opens each run once (one ranged read, or one memory map), and a
slice that starts elsewhere (a resume, or a step read by another worker at the end of an epoch)
opens exactly the pieces it needs. Nothing before ``start`` is read, except that a piece open a
few samples before the one wanted is moved forward rather than opened again: at an epoch's end
workers take turns at the steps of the longer streams, each step a sample or two from every run
of the window, and opening every run again at each turn would cost a request per run and turn
on an object store (a piece's bytes are usually fetched already).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardstream.streaming._planning.sequence import Run
from shardstream.streaming._planning.split import PassPlan
from shardstream.streaming._planning.windows import StreamId, StreamLanes, Window, build_window
from shardstream.streaming._worker.reader import ShardReader

__all__ = ["StreamCursor"]

#: Samples an open piece is moved forward over (read and dropped) instead of being opened again.
_MAX_SKIP = 32


class StreamCursor:
    """One stream of a pass, read in slices.

    Args:
        plan: The pass.
        stream: Which stream (plan rank and phase).
        reader: The worker's shard reader.
        shared: Other workers read this stream too (an epoch's last steps): what this worker
            reads next is not known, so each slice announces only its own pieces.
    """

    def __init__(
        self, plan: PassPlan, stream: StreamId, reader: ShardReader, shared: bool = False
    ) -> None:
        self._plan, self._stream, self._reader = plan, stream, reader
        self._shared = shared
        self._window: Window | None = None
        self._lanes = StreamLanes(plan.shape, stream.phase)
        self._labels: list[int] = []
        self._ordinals: list[int] = []
        self._fillers: list[bool] | None = None  # per run, with "mask": holds fillers
        self._pieces: list[Iterator[Any] | None] = []  # per run, its open piece's samples
        self._next: list[int] = []  # per run, the ordinal its open piece yields next
        self._ahead: tuple[int, Window] | None = None  # the next window, built to announce it
        self._position = 0  # where the last slice ended: a slice starting elsewhere jumped

    def read(self, start: int, stop: int) -> Iterator[Any]:
        """Samples at stream positions ``[start, stop)``, in order (``None`` for skipped ones)."""
        while start < stop:
            window = self._window
            if window is None or not window.start <= start < window.start + window.num_samples:
                window = self._load(self._lanes.window_at(start), start, stop)
            elif start != self._position:  # a jump within the window
                self._announce(window, start, stop)
            end = min(stop, window.start + window.num_samples)
            self._position = -1  # until the slice is read whole
            yield from self._emit(window, start - window.start, end - window.start)
            self._position = start = end

    def announce(self, start: int, stop: int) -> None:
        """Announce what :meth:`read` of ``[start, stop)`` would announce, without reading (a
        pass not begun yet): the window's pieces from ``start`` and the next window's, or for
        a ``shared`` cursor those of the slice alone."""
        self._load(self._lanes.window_at(start), start, stop)

    def _load(self, index: int, start: int, stop: int) -> Window:
        self._close_pieces()
        plan = self._plan
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == index:
            window = ahead[1]
        else:
            window = build_window(plan.sequence, plan.shape, plan.options, self._stream, index)
        self._window = window
        self._labels, self._ordinals = window.labels.tolist(), window.ordinals.tolist()
        self._fillers = window.fillers.tolist() if plan.shape.masked else None
        self._pieces = [None] * len(window.runs)
        self._next = [-1] * len(window.runs)
        more = self._lanes.before(index + 1) < self._lanes.total
        if self._reader.announces and more and not self._shared:
            # The next window's pieces are announced after this one's: an object store starts
            # them as this window's streams are taken, so no window waits for a first byte.
            following = build_window(
                plan.sequence, plan.shape, plan.options, self._stream, index + 1
            )
            self._ahead = (index + 1, following)
        self._announce(window, start, stop)
        return window

    def _announce(self, window: Window, start: int, stop: int) -> None:
        """Announce the pieces this window opens from stream position ``start`` on, then the
        next window's; a shared stream's, only those of the slice ``[start, stop)``.

        Read from its start, a window opens each piece at its first sample. A slice that starts
        elsewhere (a resume, or an epoch's last steps, which workers share) opens a piece at
        the first sample it reads of it: that exact range is announced, or an object store
        would make each such open wait for a first byte in turn. Where other workers read a
        stream in between (``shared``), where they leave its runs is not known yet: ranges
        announced past the slice would be fetched and dropped. Local shards need none.
        """
        if not self._reader.announces:
            return
        end = stop - window.start if self._shared else None
        pieces, expected = self._pieces, self._next
        announced = [
            (run.shard, run.first + ordinal, run.stop)
            for label, run, ordinal in _runs_from(window, start - window.start, end)
            if pieces[label] is None or not 0 <= ordinal - expected[label] <= _MAX_SKIP
        ]
        if self._ahead is not None:
            announced += [(run.shard, run.first + ordinal, run.stop)
                          for _, run, ordinal in _runs_from(self._ahead[1], 0)]  # fmt: skip
        self._reader.prefetch(announced, self)

    def _emit(self, window: Window, first: int, end: int) -> Iterator[Any]:
        """The window's samples at ``[first, end)``; with ``"mask"``, each marked ``__valid__``
        (False for a filler: a real sample read again so every rank has equal batches)."""
        pieces, expected, fillers = self._pieces, self._next, self._fillers
        for label, ordinal in zip(self._labels[first:end], self._ordinals[first:end], strict=True):
            piece = pieces[label]
            gap = ordinal - expected[label]  # 0: the open piece yields this sample next
            if piece is None or not 0 <= gap <= _MAX_SKIP:
                piece = self._open(window, label, ordinal)
            elif gap:  # samples another worker read: passed over
                for _ in range(gap):
                    next(piece)
            expected[label] = ordinal + 1
            sample = next(piece)
            if fillers is not None and sample is not None:  # None: skipped (on_error="skip")
                sample["__valid__"] = not fillers[label]
            yield sample

    def _open(self, window: Window, label: int, ordinal: int) -> Iterator[Any]:
        old = self._pieces[label]
        if old is not None:
            _close(old)
        run = window.runs[label]
        piece = self._reader.open(run.shard, run.first + ordinal, run.stop)
        self._pieces[label] = piece
        return piece

    def _close_pieces(self) -> None:
        for piece in self._pieces:
            if piece is not None:
                _close(piece)
        self._pieces = [None] * len(self._pieces)

    def close(self) -> None:
        """Close the open pieces (their file handles go back to the reader's pool) and drop
        what was announced."""
        self._close_pieces()
        self._ahead = None
        self._reader.forget(self)


def _runs_from(window: Window, offset: int, end: int | None = None) -> list[tuple[int, Run, int]]:
    """``(label, run, ordinal)`` of each run read at positions ``[offset, end)`` of the window
    (to its end when ``end`` is None), in the order of their first samples there, with the
    ordinal of that first sample."""
    labels = window.labels[offset:end]
    found, first = np.unique(labels, return_index=True)
    order = np.argsort(first, kind="stable")
    ordinals = window.ordinals[offset:end][first[order]].tolist()
    return [(label, window.runs[label], ordinal)
            for label, ordinal in zip(found[order].tolist(), ordinals, strict=True)]  # fmt: skip


def _close(piece: Iterator[Any]) -> None:
    close = getattr(piece, "close", None)
    if callable(close):
        close()
