"""What a reader asks storage for: the bytes of a range of a file, and ranges announced ahead.

A streaming worker makes one :class:`Ranges` per store and pass (``Store.ranges()``) and asks
it for byte ranges of shards; the store's backend decides how they are delivered. This base is
what object stores do: every range is a stream of ranged requests (retried, resumed at the
byte reached), announced ranges are fetched ahead by the process's fetch pool and handed over
when opened, and nothing is kept between ranges. Local files
(:class:`~shardstream._storage.backends.localmaps.LocalRanges`) add slices of whole-file memory
maps and handles kept open between pieces.

A local file that reads as if it ended early: what a ranged read of a local file returns."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Hashable, Iterator, Sequence
from typing import IO, Any, Protocol

from shardstream._storage.options import ReadOptions
from shardstream.errors import ShardNotFoundError

__all__ = [
    "BoundedFile",
    "Ranges",
    "StoreLike",
]


class StoreLike(Protocol):
    """What backends and ranges use of a :class:`~shardstream._storage.Store` (named here so
    that they need not import the store, which imports them)."""

    read_options: ReadOptions

    @property
    def secrets(self) -> list[str]: ...
    def shown(self, name: str = "") -> str: ...
    def read_target(self, name: str) -> tuple[Any, str]: ...
    def local_path(self, name: str) -> str: ...
    def open_read(self, name: str = "", start: int = 0, end: int | None = None) -> IO[bytes]: ...
    def read_bytes(self, name: str) -> bytes: ...
    def prefetch(self, ranges: Sequence[tuple[str, int, int]], group: Hashable) -> None: ...


class Ranges:
    """Byte ranges of one store's files for one reader (remote stores: a stream per range).

    Args:
        store: Where the files are.

    Attributes:
        announces: Whether :meth:`announce` does anything (ranges fetched ahead); a reader
            may skip working out what to announce when it does not.

    Examples:
        >>> ranges = Store("s3://bucket/train").ranges()  # doctest: +SKIP
        >>> with ranges.lend("shard-000000.tar", 1024, 4096) as stream:  # doctest: +SKIP
        ...     data = stream.read()
        >>> ranges.close()  # doctest: +SKIP
    """

    announces = True

    def __init__(self, store: StoreLike) -> None:
        self.store = store

    @property
    def num_idle(self) -> int:
        """Handles kept open while unused (none here)."""
        return 0

    @contextlib.contextmanager
    def lend(self, name: str, start: int = 0, end: int | None = None) -> Iterator[IO[bytes]]:
        """A read-only stream of bytes ``[start, end)`` of ``name``, closed (or kept for later
        ranges, locally) after the block. An announced range is taken over as it is under way.
        """
        stream = self.open_range(name, start, end)
        try:
            yield stream
        finally:
            stream.close()

    def open_range(self, name: str, start: int = 0, end: int | None = None) -> IO[bytes]:
        """``Store.open_read``, with a missing file named as a missing shard."""
        try:
            return self.store.open_read(name, start, end)
        except FileNotFoundError as error:
            raise ShardNotFoundError(
                f"{self.store.shown(name)}: shard not found; check that the source names "
                "existing shards (the folder, the pattern, the .txt list's entries), or pass "
                "on_error='skip' to skip and count its samples"
            ) from error

    def view(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        """Bytes ``[begin, end)`` without a read of their own (a slice of a memory map), or
        None when the store has no such view: :meth:`lend` a stream and read them."""
        return None

    def window_maps(self, stream: IO[bytes], boundaries: Sequence[int], stop: int) -> Any:
        """Memory maps of consecutive ranges of a lent ``stream``, or None (remote here)."""
        return None

    def announce(self, ranges: Sequence[tuple[str, int, int]], group: Hashable) -> None:
        """Announce ``(name, start, end)`` ranges to be lent soon, soonest first; ``group``
        replaces its earlier announcements (see ``Store.prefetch``)."""
        self.store.prefetch(ranges, group)

    def forget(self, group: Hashable) -> None:
        """Drop what ``group`` announced (closing streams not taken)."""
        from shardstream._storage.remote import prefetch as hints

        hints.forget(group)

    def close(self) -> None:
        """Release what is kept between ranges (nothing here)."""


class BoundedFile:
    """A seekable file that reads as if it ended at ``end`` (ranged reads of local files).

    Examples:
        >>> import io
        >>> stream = io.BytesIO(b"abcdef")
        >>> _ = stream.seek(1)
        >>> BoundedFile(stream, 4).read()
        b'bcd'
    """

    def __init__(self, stream: Any, end: int) -> None:
        self._stream, self._end = stream, end

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._end - self._stream.tell())
        data: bytes = self._stream.read(left if size is None or size < 0 else min(size, left))
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        left = max(0, self._end - self._stream.tell())
        return int(self._stream.readinto(view[:left] if len(view) > left else view))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._stream.seek(offset, whence))

    def tell(self) -> int:
        return int(self._stream.tell())

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> BoundedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
