"""Memory maps of local files: each file mapped once per pass, kept while it is read.

The default order reads pieces of a few samples from hundreds of places in the shards. A map
made per piece costs its ``mmap`` and ``munmap`` and page faults on a fresh mapping every time
(as much as the rest of what a raw sample costs the loader, README: *Benchmarks*).
:class:`FileMaps` maps each shard file whole and hands out slices: a piece then costs a
dictionary lookup, and pages mapped for an earlier piece fault no more. What stays mapped is
bounded in bytes of file (least recently used shards dropped first) and in count (the
descriptor budget of :class:`_MapBudget`); a dropped map is unmapped when the last sample
viewing it is released. Mapped pages are the page cache's own (shared, clean, dropped by the
kernel under pressure), but they count in the process's resident size while mapped.

Maps are copy-on-write, so samples are writable views (``torch.frombuffer`` needs no copy) and
a write changes only this process's copy of a page. A reader keeps its maps for one pass only
(:class:`~shardstream._storage.backends.localmaps.LocalRanges` clears them when it closes):
within a pass every sample is read once, so a sample a training loop wrote into is never read
again from the same map.

A file cut shorter while it is mapped faults (SIGBUS, which kills the process) where a view of
its lost bytes is touched. Each map made here is remembered with its file's name; the file's
length is asked (one ``fstat``) before a piece is mapped or sliced and before a sample is
parsed from it (:func:`still_holds`), and :func:`lost_bytes` finds the views of lost bytes
among a sample's values before they are decoded or collated (docs/guides/streaming.md, *Bad
data*).

A reader's local files: handles kept open between pieces, and whole-file memory maps.

:class:`LocalRanges` is what the local backend lends a streaming worker (see
:mod:`shardstream._storage.ranges`); the shard cache's reader
(:class:`~shardstream._storage.backends.cached.CachedRanges`) refines it for remote shards kept
whole on local disk."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import os
import threading
import weakref
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import IO

from shardstream._storage.options import file_budget
from shardstream._storage.ranges import Ranges, StoreLike

__all__ = [
    "DEFAULT_MAP_CACHE_BYTES",
    "FileMaps",
    "LocalRanges",
    "MAP_WINDOW_BYTES",
    "MappedFile",
    "WindowMaps",
    "lost_bytes",
    "map_range",
    "still_holds",
]


#: Bytes of shard files a reader keeps mapped in a pass (least recently used dropped).
DEFAULT_MAP_CACHE_BYTES = 2 << 30
#: Most bytes of a file mapped at once by :class:`WindowMaps`. A mapping stays until every view
#: in it is released, so this bounds the bytes one held sample keeps mapped (about 14 JPEGs of
#: 70 KB).
MAP_WINDOW_BYTES = 1 << 20


class _MapBudget:
    """Live memory maps of this process, at most half its open-file budget.

    Python's ``mmap`` keeps a duplicate of the file descriptor for as long as the map lives, so
    every live map holds an open file. A worker reading from hundreds of places at once would
    otherwise run out of descriptors (``ulimit -n`` is 256 to 1,024 on many systems); past the
    budget, samples are read into memory instead of mapped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live = 0
        self.limit: int | None = None

    def take(self, count: int = 1) -> bool:
        """Count ``count`` more open descriptors, if the budget has room for them."""
        with self._lock:
            if self.limit is None:
                self.limit = file_budget(0.5, 4096)
            if self.live + count > self.limit:
                return False
            self.live += count
            return True

    def give_back(self, count: int = 1) -> None:
        with self._lock:
            self.live -= count


_MAPS = _MapBudget()

#: Each live map made here, by ``id``: its file's name for messages, and the file offset it
#: starts at (a plain dict: looked up for every sample).
_NAMED: dict[int, tuple[str, int]] = {}


def _track(mapping: mmap.mmap, name: str, base: int) -> None:
    """Count ``mapping`` in the budget until it is unmapped, and remember its file."""
    _NAMED[id(mapping)] = (name, base)
    weakref.finalize(mapping, _untrack, id(mapping))


def _untrack(key: int) -> None:
    _NAMED.pop(key, None)  # before the id can be reused: finalizers run as the map dies
    _MAPS.give_back()


def lost_bytes(values: Iterable[object]) -> str | None:
    """What is wrong with the first of ``values`` that views memory-mapped bytes its file no
    longer holds (the file's name, its length now and the bytes lost), or None.

    Touching such a view kills the process with SIGBUS: check a sample's values right before
    they are touched. A check costs a type test per value and one ``fstat`` per map met; only
    views into maps made by this module are checked (other values pass).

    Examples:
        >>> lost_bytes([b"bytes", 3, memoryview(b"not mapped")]) is None
        True
    """
    whole: set[int] = set()  # maps found whole: one fstat per map, not per view (a batch's
    # images come from a few shards, in shuffled order)
    for value in values:
        if type(value) is not memoryview:
            continue
        owner = value.obj
        if id(owner) in whole or type(owner) is not mmap.mmap:
            continue
        named = _NAMED.get(id(owner))
        if named is None:
            continue
        try:
            size = owner.size()  # fstat of the map's own descriptor
        except (OSError, ValueError):  # a closed map: nothing can view it
            continue
        if size >= named[1] + len(owner):
            whole.add(id(owner))
            continue
        begin = named[1] + _address(value) - _address(owner) if value.nbytes else 0
        if begin + value.nbytes > size:
            return _lost_message(named[0], size, begin, begin + value.nbytes)
    return None


def _address(buffer: object) -> int:
    """Where a writable buffer's first byte is in memory (copy-on-write maps are writable)."""
    holder = ctypes.c_char.from_buffer(buffer)  # type: ignore[arg-type]
    try:
        return ctypes.addressof(holder)
    finally:
        del holder  # a live export would keep the map from closing


def _lost_message(name: str, size: int, begin: int, end: int) -> str:
    return (
        f"{name or 'a memory-mapped shard'}: the file is now {size:,} bytes, but a sample read "
        f"from its memory map needs bytes {begin:,}..{end:,}: the shard was cut or rewritten "
        "while it was being read (a build or copy into the same file, an rsync or sync under "
        "way). Replace shards by renaming a new file over them, check them with `shardstream "
        "verify`, or pass on_error='skip' (or StreamOptions(memory_map=False) to read instead "
        "of mapping)."
    )


def still_holds(data: memoryview, end: int) -> bool:
    """Whether ``data`` may be touched up to file byte ``end``: False when it views a memory
    map whose file now ends before ``end`` (touching it would kill the process with SIGBUS:
    read the bytes instead, and the reader reports what is missing). True for anything else.
    One ``fstat`` for a map."""
    owner = data.obj
    if type(owner) is not mmap.mmap:
        return True
    try:
        return end <= owner.size()  # fstat of the map's own descriptor
    except (OSError, ValueError):  # a closed map: nothing views it
        return True


def _file_too_short(fileno: int, end: int) -> bool:
    """Whether the file open as ``fileno`` ends before byte ``end`` (one ``fstat``): mapping
    or touching its bytes past the end would kill the process with SIGBUS."""
    try:
        return os.fstat(fileno).st_size < end
    except OSError:
        return True


def map_range(fileno: int, begin: int, end: int, name: str = "") -> memoryview | None:
    """Bytes ``[begin, end)`` of an open local file as a copy-on-write memory map, or None.

    None when the process has as many live maps as its open-file limit allows (see
    :class:`_MapBudget`) or the map fails (then read the bytes instead). The map is released
    when the last view into it is. ``name`` (the file's) is what :func:`lost_bytes` reports.
    """
    if not _MAPS.take():
        return None
    base = begin - begin % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fileno, end - base, access=mmap.ACCESS_COPY, offset=base)
    except (OSError, ValueError):  # e.g. the process's limit on mappings
        _MAPS.give_back()
        return None
    _track(mapping, name, base)
    _read_ahead(mapping, fileno, begin, end, base)
    return memoryview(mapping)[begin - base :]


_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)


def _read_ahead(mapping: mmap.mmap, fileno: int, begin: int, end: int, base: int) -> None:
    """Ask the kernel to read file bytes ``[begin, end)`` of ``mapping`` (which starts at file
    byte ``base``) at once, unless they are in the page cache already: a cold cache then reads
    the range in one go instead of a page fault at a time."""
    if _WILLNEED is None or _cached(fileno, begin, end):
        return
    start = begin - begin % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):  # only advice: reading works without it
        mapping.madvise(_WILLNEED, start - base, end - start)


_PROBE = bytearray(1)  # what _cached reads into (never looked at)


def _cached(fileno: int, begin: int, end: int) -> bool:
    """Whether the first and last bytes of ``[begin, end)`` are in the page cache.

    Two one-byte ``preadv(RWF_NOWAIT)`` calls (Linux), which fail instead of reading the disk:
    about 1 us together, where ``MADV_WILLNEED`` on a cached range costs 10-12 us (it looks up
    every page). False when it cannot tell (other systems, file systems without ``NOWAIT``).
    """
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return False
    try:
        return (
            os.preadv(fileno, [_PROBE], begin, flag)
            == 1
            == os.preadv(fileno, [_PROBE], end - 1, flag)
        )
    except OSError:  # BlockingIOError: not cached; EOPNOTSUPP and the like: cannot tell
        return False


class MappedFile:
    """One local file mapped whole (copy-on-write), and the descriptor its cache probes use.

    Attributes:
        size: The file's length when mapped.
    """

    __slots__ = ("__weakref__", "_fd", "_mapping", "_view", "size")

    def __init__(self, fd: int, size: int, name: str = "") -> None:
        self.size = size
        self._mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        self._view = memoryview(self._mapping)
        self._fd = os.dup(fd)  # for the page-cache probe (mmap hides its own copy)
        _track(self._mapping, name, 0)  # unmapped with its last view

    def piece(self, begin: int, end: int) -> memoryview | None:
        """Bytes ``[begin, end)``; read ahead by the kernel at once when they are not cached.
        None when the file no longer reaches ``end`` (cut since it was mapped: read it, and
        the reader reports what is missing)."""
        if not still_holds(self._view, end):
            return None
        _read_ahead(self._mapping, self._fd, begin, end, 0)
        return self._view[begin:end]


class FileMaps:
    """Whole-file maps of one reader, least recently used dropped past ``max_bytes``.

    Args:
        max_bytes: Bytes of files kept mapped; a file larger than this is never mapped whole
            (map its pieces one by one instead).

    Examples:
        >>> maps = FileMaps(1 << 30)
        >>> maps.get("shard-000000.tar") is None
        True
    """

    def __init__(self, max_bytes: int = DEFAULT_MAP_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: collections.OrderedDict[Hashable, MappedFile] = collections.OrderedDict()
        self._bytes = 0

    @property
    def mapped_bytes(self) -> int:
        """Bytes of the files mapped now."""
        return self._bytes

    def get(self, key: Hashable) -> MappedFile | None:
        """The map of ``key``, if it is kept."""
        found = self._files.get(key)
        if found is not None:
            self._files.move_to_end(key)
        return found

    def open(self, key: Hashable, fd: int, size: int, name: str = "") -> MappedFile | None:
        """Map the file open as ``fd`` (``size`` bytes long) and keep it as ``key``. None when
        the file is empty, larger than the budget, or cannot be mapped (map pieces then).
        ``name`` (the file's) is what :func:`lost_bytes` reports."""
        if not 0 < size <= self.max_bytes or not _MAPS.take(2):
            return None
        try:
            mapped = MappedFile(fd, size, name)
        except (OSError, ValueError):  # e.g. the process's limit on mappings
            _MAPS.give_back(2)
            return None
        weakref.finalize(mapped, _close_probe, mapped._fd)
        self.drop(key)
        self._files[key] = mapped
        self._bytes += size
        while self._bytes > self.max_bytes:
            self.drop(next(iter(self._files)))
        return mapped

    def drop(self, key: Hashable) -> None:
        """Stop keeping ``key``'s map (it is unmapped once no sample views it)."""
        found = self._files.pop(key, None)
        if found is not None:
            self._bytes -= found.size

    def clear(self) -> None:
        """Drop every map."""
        self._files.clear()
        self._bytes = 0


def _close_probe(fd: int) -> None:
    os.close(fd)
    _MAPS.give_back()


class WindowMaps:
    """Consecutive ranges of one open local file as views of copy-on-write memory maps.

    The ranges are ``[boundaries[i], boundaries[i + 1])`` (a shard's samples, by its index).
    Each mapping covers a window of whole consecutive ranges (at most ``window`` bytes, or one
    larger range) and is unmapped when the last view into it is released. Views are writable
    (copy-on-write: writing changes this process's page, never the file), so
    ``torch.frombuffer`` wraps them without a copy or a warning.

    Args:
        stream: An open local file.
        boundaries: Where each range starts, then where the last one ends.
        stop: One past the last range that will be asked for.
        window: Most bytes mapped at once.

    Examples:
        >>> with open("shard-000000.tar", "rb") as stream:  # doctest: +SKIP
        ...     view = WindowMaps(stream, offsets, 8).view(3)  # bytes of range 3, or None
    """

    def __init__(
        self, stream: IO[bytes], boundaries: Sequence[int], stop: int,
        window: int = MAP_WINDOW_BYTES,
    ) -> None:  # fmt: skip
        self._offsets, self._stop, self._window = boundaries, stop, window
        self._view: memoryview | None = None
        self._base = self._end = 0
        self._name = str(getattr(stream, "name", ""))
        try:
            self._fileno = stream.fileno()
            # Mapping bytes past the end of the file would fault: a shorter file is read (and
            # reported) by the caller instead.
            self.usable = os.fstat(self._fileno).st_size >= boundaries[stop]
        except (OSError, ValueError):  # no file descriptor (io.UnsupportedOperation is both)
            self.usable = False

    def view(self, ordinal: int) -> memoryview | None:
        """The bytes of range ``ordinal``, or None when they cannot be mapped, or the file no
        longer holds them (read them: the reader reports what is missing)."""
        here, after = self._offsets[ordinal], self._offsets[ordinal + 1]
        view = self._view
        if view is None or here < self._base or after > self._end:
            if not self.usable or after <= here:
                return None
            view = self._map(ordinal)
            if view is None:
                return None
        elif not still_holds(view, after):  # the file was cut since: read from now on
            self.usable, self._view = False, None
            return None
        return view[here - self._base : after - self._base]

    def _map(self, ordinal: int) -> memoryview | None:
        offsets = self._offsets
        base = offsets[ordinal] - offsets[ordinal] % mmap.ALLOCATIONGRANULARITY
        last = ordinal + 1
        while last < self._stop and offsets[last + 1] - base <= self._window:
            last += 1
        if _file_too_short(self._fileno, offsets[last]):  # cut since: read (the reader reports)
            self.usable, self._view = False, None
            return None
        view = map_range(self._fileno, base, offsets[last], self._name)
        if view is None:  # out of maps or descriptors: read from now on
            self.usable, self._view = False, None
            return None
        self._view, self._base, self._end = view, base, offsets[last]
        return self._view


#: An idle handle: (file name, handle, file length or -1 when not asked yet).
_Idle = tuple[str, IO[bytes], int]


class LocalRanges(Ranges):
    """A reader's local files: idle handles reused by later pieces, and whole-file maps.

    A handle is lent to one piece at a time, so pieces of one file read at once never share a
    file position. Call :meth:`close` when the pass ends (the worker does, also on errors).

    Args:
        store: Where the files are.
        max_idle: Idle handles kept open; each costs one file descriptor.
        max_map_bytes: Bytes of files kept mapped whole until :meth:`close` (see :meth:`view`).
    """

    announces = False

    def __init__(self, store: StoreLike, max_idle: int = 64, max_map_bytes: int = 2 << 30) -> None:
        super().__init__(store)
        self._max_idle = max_idle
        self._idle: collections.OrderedDict[int, _Idle] = collections.OrderedDict()
        self._by_name: dict[str, list[int]] = {}  # idle handles of each file, newest last
        self._maps = FileMaps(max_map_bytes)
        self._closed = False
        # Ranges dropped without close() (a dataset's reader kept for the process's life)
        # still close their idle files.
        weakref.finalize(self, _close_idle, self._idle)

    @property
    def num_idle(self) -> int:
        """Handles currently kept open while unused."""
        return len(self._idle)

    @contextlib.contextmanager
    def lend(self, name: str, start: int = 0, end: int | None = None) -> Iterator[IO[bytes]]:
        """A plain file positioned at ``start`` (the caller stops at ``end``), so it can be
        lent again for another range once given back."""
        stream, length = self._take(name)
        given = False
        try:
            stream.seek(start)
            yield stream
            given = True
        finally:
            self._release(name, stream, length, reusable=given)

    def view(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        """Bytes ``[begin, end)`` as a slice of the file's map, made whole on its first range
        and kept until :meth:`close` (later ranges cost a lookup and a slice). A file larger
        than the map budget, or met when the process is out of maps, has the range mapped
        alone (unless ``alone`` is False: a short range is cheaper to read). None when the
        file is shorter than ``end`` (a map past the end of a file faults; a kept map's file
        is asked again for each range, in case it was cut since) or no map can be made: read
        the bytes then."""
        mapped = self._maps.get(name)
        if mapped is None:
            stream, length = self._take(name)
            try:
                length = length if length >= 0 else _file_length(stream)
                shown = self.store.shown(name)
                fileno = stream.fileno()
                mapped = None if self._closed else self._maps.open(name, fileno, length, shown)
                if mapped is None:
                    mappable = alone and length >= end
                    return map_range(fileno, begin, end, shown) if mappable else None
            finally:
                self._release(name, stream, length)
        return mapped.piece(begin, end) if mapped.size >= end else None

    def window_maps(
        self, stream: IO[bytes], boundaries: Sequence[int], stop: int
    ) -> WindowMaps | None:
        """Windows of ``stream``'s ranges ``[boundaries[i], boundaries[i + 1])`` mapped a few
        at a time (see :class:`~.localmaps.WindowMaps`)."""
        return WindowMaps(stream, boundaries, stop)

    def _take(self, name: str) -> tuple[IO[bytes], int]:
        """An idle handle of ``name`` (a new one if none) and its length (-1: not asked)."""
        slots = self._by_name.get(name)
        if not slots:
            return self.open_range(name), -1
        slot = slots.pop()
        if not slots:
            del self._by_name[name]
        _, stream, length = self._idle.pop(slot)
        return stream, length

    def _release(self, name: str, stream: IO[bytes], length: int, reusable: bool = True) -> None:
        """Keep ``stream`` for later pieces, or close it (the ranges are closed, or it failed)."""
        if not reusable or self._closed:
            stream.close()
            return
        self._idle[id(stream)] = (name, stream, length)
        self._by_name.setdefault(name, []).append(id(stream))
        while len(self._idle) > self._max_idle:
            slot, (oldest_name, oldest, _) = self._idle.popitem(last=False)
            slots = self._by_name[oldest_name]
            slots.remove(slot)
            if not slots:
                del self._by_name[oldest_name]
            oldest.close()

    def close(self) -> None:
        """Close every idle handle and drop the maps; handles still lent are closed when given
        back, and each map goes once no sample views it."""
        self._closed = True
        self._by_name.clear()
        self._maps.clear()
        _close_idle(self._idle)


def _file_length(stream: IO[bytes]) -> int:
    """The length of an open local file (0 when it has no descriptor to ask)."""
    try:
        return os.fstat(stream.fileno()).st_size
    except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both)
        return 0


def _close_idle(idle: collections.OrderedDict[int, _Idle]) -> None:
    while idle:
        _, (_, stream, _) = idle.popitem(last=False)
        stream.close()
