"""A local file that reads as if it ended early: what a ranged read of a local file returns."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["BoundedFile"]


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
