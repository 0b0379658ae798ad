"""Per-sample index of a shard: the ``shard-NNNNNN.idx`` sidecar with byte offsets and key hashes.

A reader that starts in the middle of a shard needs the byte offset of its first sample. The
writer (and ``shardstream index``, for shards made by other tools) knows every offset, so it
stores them next to the shard; a reader then opens exactly the byte range of the samples it
wants, with no walk over the tar headers before them. Version 2 also stores a 64-bit hash of
every sample's key (:func:`shardstream._format.keys.key_hash`), so looking a sample up by key,
and selecting samples by key for a view, need no reading of the shard. Version 3 also stores
every sample's content digest (:mod:`shardstream._format.keys`), so duplicates are found
from indexes alone; it names its sample count first, so a reader that needs offsets and keys
reads them and not the digests after them. Version 4 is version 3 followed by the height and
width of every sample's pixel image (``build --pixels``: ``KEY.pixels.npy``, 3 channels), so a
tool learns every image's size from the index alone.

Format (little-endian)::

    magic   8 bytes  b"SSTIDX\\0\\0"
    version uint64   1, 2, 3 or 4
    count   uint64   versions 3 and 4: the number of samples
    offsets uint64   one per sample: where its first member's header starts
    end     uint64   where the last sample's last member ends
    keys    uint64   versions 2 and 3: one key hash per sample
    digests 16 bytes versions 3 and 4: one content digest per sample
    shapes  uint16   version 4: height, width of each sample's pixel image

Tools that do not know the sidecar (tar, webdataset) simply ignore it. Indexes of versions 1
and 2 stay readable; they have no digests (``shardstream index --overwrite`` writes version 3).
"""

from __future__ import annotations

import array
import dataclasses
import sys
from collections.abc import Sequence

import numpy as np

from shardstream._format.keys import DIGEST_BYTES
from shardstream._format.tarformat import BLOCK, END_BYTES
from shardstream.errors import ShardFormatError

__all__ = [
    "INDEX_VERSION",
    "ShardIndex",
    "decode_index",
    "decode_offsets",
    "encode_offsets",
    "index_key_hashes",
    "index_name",
    "index_version",
]

INDEX_VERSION = 3  # what indexes without pixel shapes are written as; with them, 4
_MAGIC = b"SSTIDX\0\0"
_HEADER_BYTES = 16
#: A pixel image's height and width, two uint16 (version 4).
_SHAPE_BYTES = 4


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """A decoded index: sample offsets (then the end), key hashes and content digests when
    stored (digests: ``uint8`` of shape ``(samples, 16)``), and pixel images' sizes (version 4,
    read whole: ``uint16`` of shape ``(samples, 2)``, height and width)."""

    offsets: array.array[int]
    key_hashes: np.ndarray | None
    digests: np.ndarray | None = None
    shapes: np.ndarray | None = None


def index_name(shard_name: str) -> str:
    """``"shard-000003.tar"`` -> ``"shard-000003.idx"`` (the sidecar's name)."""
    stem = shard_name[: -len(".tar")] if shard_name.endswith(".tar") else shard_name
    return stem + ".idx"


def encode_offsets(
    offsets: Sequence[int],
    key_hashes: Sequence[int] | None = None,
    digests: Sequence[bytes] | bytes | None = None,
    shapes: Sequence[tuple[int, int]] | None = None,
) -> bytes:
    """The index file's bytes: sample offsets plus the end, and optionally the key hashes and
    (with them) the content digests (16 bytes each, or one blob of them), and (with those) the
    ``(height, width)`` of every sample's pixel image.

    Examples:
        >>> decode_offsets(encode_offsets([0, 1536, 3072]), "x.idx").tolist()
        [0, 1536, 3072]
    """
    values = array.array("Q", offsets)
    version, tail = 1, b""
    if key_hashes is not None:
        if len(key_hashes) != len(values) - 1:
            raise ValueError("an index needs one key hash per sample")
        values.extend(np.asarray(key_hashes, dtype=np.int64).view(np.uint64).tolist())
        version = 2
    if digests is not None:
        tail = digests if isinstance(digests, bytes) else b"".join(digests)
        if key_hashes is None or len(tail) != DIGEST_BYTES * (len(values) - 1) // 2:
            raise ValueError("an index with digests needs key hashes and 16 bytes per sample")
        version = 3
    if shapes is not None:
        if version != 3 or len(shapes) != len(values) // 2:
            raise ValueError("an index with shapes needs digests and one shape per sample")
        tail += np.asarray(shapes, dtype="<u2").reshape(-1, 2).tobytes()
        version = 4
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        values.byteswap()
    count = (len(offsets) - 1).to_bytes(8, "little") if version >= 3 else b""
    return _MAGIC + version.to_bytes(8, "little") + count + values.tobytes() + tail


def index_version(data: bytes | memoryview) -> int:
    """The version an index's bytes say they are (0 when they are not an index)."""
    return int.from_bytes(data[8:_HEADER_BYTES], "little") if data[:8] == _MAGIC else 0


def decode_index(
    data: bytes, url: str, num_samples: int | None = None, num_bytes: int | None = None
) -> ShardIndex:
    """Parse an index file; ``url`` names it in errors; the manifest's counts are checked if given.

    Every offset must be a 512-byte tar block boundary and larger than the one before (a
    sample takes at least one block; the first need not be 0, since entries that belong to no
    sample, such as GNU tar's leading directory entry, may come before it), and the samples
    must end before the shard's end-of-archive blocks, so an index that belongs to another
    shard or build is refused rather than used to read wrong bytes. A version-3 index read
    only up to its key hashes (what a reader needs) decodes without digests.

    Raises:
        ShardFormatError: Wrong magic or version, a torn file, offsets out of order or off the
            tar block grid, another sample count than ``num_samples``, or an end offset that
            does not fit a shard of ``num_bytes``.
    """
    if data[:8] != _MAGIC:
        raise ShardFormatError(f"{url}: not a shardstream index (bad magic {data[:8]!r})")
    version = index_version(data)
    if version not in (1, 2, 3, 4):
        raise ShardFormatError(
            f"{url}: index version {version} is not supported (this release reads 1 to 4); "
            "upgrade shardstream or rebuild the dataset"
        )
    if version >= 3:
        return _decode_with_digests(data, url, num_samples, num_bytes, version == 4)
    body = data[_HEADER_BYTES:]
    if not body or len(body) % 8 or (version == 2 and len(body) % 16 != 8):
        raise ShardFormatError(f"{url}: index body of {len(body)} bytes is torn or empty")
    values = np.frombuffer(body, dtype="<u8")
    keys = None
    if version == 2:
        count = (len(values) - 1) // 2
        values, keys = values[: count + 1], values[count + 1 :].view("<i8").astype(np.int64)
    _check_offsets(values, url, num_samples, num_bytes)
    # From native bytes, not a list: a list costs a Python int per sample (1.4 ms at 10,000).
    return ShardIndex(array.array("Q", values.astype(np.uint64).tobytes()), keys)


def _decode_with_digests(
    data: bytes, url: str, num_samples: int | None, num_bytes: int | None, shaped: bool = False
) -> ShardIndex:
    count = int.from_bytes(data[_HEADER_BYTES : _HEADER_BYTES + 8], "little")
    if num_samples is not None and count != num_samples:
        raise _count_error(url, count, num_samples)
    start = _HEADER_BYTES + 8
    keys_end = start + 8 * (2 * count + 1)
    digests_end = keys_end + DIGEST_BYTES * count
    full = digests_end + (_SHAPE_BYTES * count if shaped else 0)
    if len(data) not in (keys_end, digests_end, full) or count >= 1 << 40:
        raise ShardFormatError(f"{url}: index of {len(data)} bytes is torn (for {count} samples)")
    values = np.frombuffer(data, dtype="<u8", count=2 * count + 1, offset=start)
    offsets, keys = values[: count + 1], values[count + 1 :].view("<i8").astype(np.int64)
    _check_offsets(offsets, url, num_samples, num_bytes)
    digests = shapes = None
    if len(data) >= digests_end:
        digests = np.frombuffer(data, np.uint8, DIGEST_BYTES * count, keys_end)
        digests = digests.reshape(count, DIGEST_BYTES)
    if shaped and len(data) == full:
        shapes = np.frombuffer(data, "<u2", 2 * count, digests_end).reshape(count, 2)
    offsets_array = array.array("Q", offsets.astype(np.uint64).tolist())
    return ShardIndex(offsets_array, keys, digests, shapes)


def _check_offsets(
    values: np.ndarray, url: str, num_samples: int | None, num_bytes: int | None
) -> None:
    # The first sample may start after other entries (GNU tar's leading directory entry).
    if np.any(values % BLOCK) or np.any(np.diff(values) == 0):
        raise ShardFormatError(f"{url}: index offsets are not increasing tar block boundaries")
    if np.any(values[1:] < values[:-1]):
        raise ShardFormatError(f"{url}: index offsets go backwards; the index is corrupt")
    if num_samples is not None and len(values) != num_samples + 1:
        raise _count_error(url, len(values) - 1, num_samples)
    if num_bytes is not None and int(values[-1]) + END_BYTES > num_bytes:
        raise ShardFormatError(
            f"{url}: index says the samples end at byte {int(values[-1])}, but the shard's "
            f"{num_bytes} bytes end them at {num_bytes - END_BYTES} at most; the index belongs "
            "to another build. Rebuild the dataset or run `shardstream verify`."
        )


def index_key_hashes(data: bytes | memoryview, url: str) -> np.ndarray | None:
    """The key hashes of an index (None for version 1), without decoding its offsets: what
    finding samples by key across a million shards needs, at a few microseconds a shard.

    Raises:
        ShardFormatError: Not an index, or torn.
    """
    version = index_version(data)
    if version == 1:
        return None
    if version == 2 and len(data) % 16 == 8 and len(data) > _HEADER_BYTES:
        count, start = (len(data) - _HEADER_BYTES - 8) // 16, _HEADER_BYTES
    elif version in (3, 4) and len(data) >= _HEADER_BYTES + 16:
        count, start = int.from_bytes(data[16:24], "little"), _HEADER_BYTES + 8
    else:
        return decode_index(bytes(data), url).key_hashes  # raises with the reason
    end = start + 8 * (2 * count + 1)
    if len(data) < end:
        raise ShardFormatError(f"{url}: index of {len(data)} bytes is torn (for {count} samples)")
    return np.frombuffer(data, "<i8", count, start + 8 * (count + 1)).astype(np.int64)


def _count_error(url: str, found: int, expected: int) -> ShardFormatError:
    return ShardFormatError(
        f"{url}: index lists {found} samples, the manifest {expected}; readers read the "
        f"manifest's {expected} (epochs follow it): run `shardstream verify`, then rebuild or "
        "re-index the dataset"
    )


def decode_offsets(
    data: bytes, url: str, num_samples: int | None = None, num_bytes: int | None = None
) -> array.array[int]:
    """The sample offsets of an index (see :func:`decode_index`)."""
    return decode_index(data, url, num_samples, num_bytes).offsets
