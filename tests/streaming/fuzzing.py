"""A seeded mutation fuzzer for everything a reader takes from storage: shards, indexes, manifests.

Run as ``python -m tests.streaming.fuzzing --cases N --seed S``: it prints one JSON line with the
outcome counts and every failing case. A case passes when reading ends in samples or in the
documented error (``ShardFormatError`` for shards and indexes, ``ManifestError`` for manifests)
within ``--case-timeout-s``; anything else (another exception, a hang, a crash) is a failure.
``tests/streaming/test_fuzz.py`` runs it in a child process under a memory cap.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import json
import pathlib
import random
import resource
import signal
import tarfile
import tempfile
import time
from typing import Any

from shardstream._format.manifest import Manifest
from shardstream._format.shardindex import decode_offsets
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._storage import Store
from shardstream.errors import ManifestError, ShardFormatError
from shardstream.streaming._worker.pieces import open_piece

_BLOCK = 512
_INTERESTING_SIZES = [
    b"77777777777\0",  # 8 GiB - 1 in octal
    b"00000001000\0",
    b"zzzzzzzzzzz\0",
    b"-0000000001\0",
    b"           \0",
    b"\x80" + (1 << 40).to_bytes(11, "big"),  # GNU base-256: 1 TiB
    b"\xff" * 12,  # base-256 negative
    b"\0" * 12,
]
_PAX_RECORDS = [
    b"0 path=x\n",
    b"1 x",
    b"3 a\n",
    b"-5 path=x\n",
    b"99999999 path=x\n",
    b"abc path=x\n",
    b"15 path=a.jpg",
    b"12 size=99\n",
    b"20 size=99999999999\n",
    b"14 size=-1234\n",
    b"13 size=abcd\n",
    b" 9 path=x\n",
    b"9 novalue\n",
    b"18 path=\xff\xfe.jpg\n",
    b"\0\0\0\0",
]


class CaseTimeout(Exception):
    """A case ran past its time bound (raised from the SIGALRM handler)."""


@dataclasses.dataclass(frozen=True)
class Base:
    """A valid input to mutate, and how to read it."""

    name: str
    data: bytes
    offsets: tuple[int, ...] | None = None  # the shard's valid byte-offset index


def _tiny_jpeg(index: int) -> bytes:
    from tests.conftest import encode_image

    return encode_image(8 + index, 8, seed=index)


def _shardstream_shard() -> tuple[Base, Base, Base]:
    from shardstream.shardwriter import build_shards

    samples = [
        {"__key__": f"s{i:03d}", "jpg": _tiny_jpeg(i), "cls": i % 3, "json": {"i": i}}
        for i in range(6)
    ]
    with tempfile.TemporaryDirectory() as folder:
        manifest = build_shards(samples, folder, max_samples_per_shard=6, shuffle=False)
        shard = manifest.shards[0]
        root = pathlib.Path(folder)
        data = (root / shard.name).read_bytes()
        index = (root / str(shard.index)).read_bytes()
        text = (root / "manifest.json").read_bytes()
    offsets = tuple(decode_offsets(index, "idx").tolist())
    return Base("shardstream", data, offsets), Base("index", index), Base("manifest", text)


def _tarfile_shard(fmt: int, name: str) -> Base:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for i in range(4):
            for extension, payload in (("jpg", _tiny_jpeg(i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{'d' * 120}/k{i}.{extension}")
                info.size = len(payload)
                if fmt == tarfile.PAX_FORMAT:
                    info.pax_headers = {"comment": "é" * (i + 1)}
                tar.addfile(info, io.BytesIO(payload))
    return Base(name, buffer.getvalue())


def pax_shard(records: bytes) -> bytes:
    """A tar whose first member carries ``records`` as its PAX header (checksum valid)."""
    out = io.BytesIO()
    out.write(tar_header(b"PaxHeader/x", len(records), b"x"))
    out.write(records + bytes(-len(records) % _BLOCK))
    payload = _tiny_jpeg(0)
    out.write(tar_header(b"k0.jpg", len(payload), b"0"))
    out.write(payload + bytes(-len(payload) % _BLOCK))
    out.write(bytes(2 * _BLOCK))
    return out.getvalue()


def tar_header(name: bytes, size: int, kind: bytes) -> bytes:
    header = bytearray(_BLOCK)
    header[0 : len(name)] = name
    header[100:108] = b"0000644\0"
    header[124:136] = b"%011o\0" % size
    header[156:157] = kind
    header[257:263] = b"ustar\0"
    return _with_checksum(header)


def _with_checksum(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def bases() -> list[Base]:
    """The valid inputs the mutations start from."""
    shard, index, manifest = _shardstream_shard()
    return [
        shard,
        Base("gzip", gzip.compress(shard.data, mtime=0)),
        _tarfile_shard(tarfile.PAX_FORMAT, "pax"),
        _tarfile_shard(tarfile.GNU_FORMAT, "gnu"),
        index,
        manifest,
    ]


def _header_offsets(data: bytes) -> list[int]:
    """Offsets of the blocks that carry a valid header checksum."""
    found = []
    for offset in range(0, len(data) - _BLOCK + 1, _BLOCK):
        block = data[offset : offset + _BLOCK]
        stored = block[148:156].split(b"\0", 1)[0].strip()
        if stored.isdigit() and int(stored, 8) == sum(block) - sum(block[148:156]) + 256:
            found.append(offset)
    return found


def mutate(base: Base, rng: random.Random) -> tuple[str, bytes]:
    """One mutation of ``base``: ``(description, bytes)``."""
    data = bytearray(base.data)
    choice = rng.choice(["flip", "bytes", "truncate", "header", "pax", "splice"])
    if choice == "pax" or (choice == "header" and base.name in ("index", "manifest", "gzip")):
        records = b"".join(rng.choice(_PAX_RECORDS) for _ in range(rng.randint(1, 3)))
        return f"pax {records!r}", pax_shard(records)
    if choice == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return "flip", bytes(data)
    if choice == "bytes":
        start = rng.randrange(len(data))
        value = rng.choice([b"\0", b"\xff", b"7", bytes([rng.randrange(256)])])
        data[start : start + rng.randint(1, 16)] = value * rng.randint(1, 16)
        return f"bytes at {start}", bytes(data)
    if choice == "truncate":
        cut = rng.randrange(len(data))
        cut = cut if rng.random() < 0.7 else cut // _BLOCK * _BLOCK  # at a block boundary
        return f"truncate at {cut}", bytes(data[:cut])
    if choice == "header":
        return _mutate_header(data, rng)
    start = rng.randrange(len(data))
    piece = bytes(data[start : start + rng.choice([1, 100, 512, 1024])])
    position = rng.randrange(len(data))
    return f"splice {len(piece)} at {position}", bytes(data[:position] + piece + data[position:])


def _mutate_header(data: bytearray, rng: random.Random) -> tuple[str, bytes]:
    offset = rng.choice(_header_offsets(bytes(data)) or [0])
    header = bytearray(data[offset : offset + _BLOCK])
    field = rng.choice(["size", "type", "name", "prefix"])
    if field == "size":
        header[124:136] = rng.choice(_INTERESTING_SIZES)
    elif field == "type":
        header[156:157] = rng.choice([b"L", b"x", b"g", b"K", b"5", b"2", b"A", b"\0", b"7"])
    elif field == "name":
        header[0:100] = rng.choice([b"\0" * 100, b"a" * 100, b"x.jpg".ljust(100, b"\0")])
    else:
        header[345:500] = rng.choice([b"p" * 155, b"\xff" * 155, b"\0" * 155])
    fixed = _with_checksum(header) if rng.random() < 0.9 else bytes(header)
    data[offset : offset + _BLOCK] = fixed
    return f"header {field} at {offset}", bytes(data)


def read_shard(data: bytes, url: str, offsets: tuple[int, ...] | None) -> int:
    """Every way a worker reads a shard; returns samples seen. Raises ShardFormatError.

    The first read goes through a real file (whose reads allocate what they are asked for).
    """
    with open(_SCRATCH[0], "wb") as scratch:
        scratch.write(data)
    with open(_SCRATCH[0], "rb") as stream:
        count = len(list(iter_samples(open_tar(stream, url))))
    count += len(list(iter_samples(open_tar(io.BytesIO(data), url), want_data=False)))
    non_seekable = _Unseekable(data)
    count += len(list(iter_samples(open_tar(non_seekable, url))))  # type: ignore[arg-type]
    if offsets is not None:
        scratch = pathlib.Path(_SCRATCH[0])
        pool = Store(scratch.parent).ranges()
        try:
            last = len(offsets) - 1
            count += len(list(open_piece(pool, scratch.name, 0, last, None, offsets)))
            count += len(list(open_piece(pool, scratch.name, 2, 4, None, offsets)))
        finally:
            pool.close()
    return count


class _Unseekable:
    """A stream that can only be read forward (as a socket or pipe)."""

    def __init__(self, data: bytes) -> None:
        self._stream = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)


def run_case(base: Base, data: bytes, valid_index: tuple[int, ...] | None) -> str:
    """Read one mutated input; return ``"samples"`` or ``"error"`` (anything else raises)."""
    try:
        if base.name == "manifest":
            Manifest.from_json(data, where="manifest.json")
        elif base.name == "index":
            shard = _SHARD_FOR_INDEX[0]
            offsets = decode_offsets(data, "shard.idx", num_samples=6, num_bytes=len(shard))
            read_shard(shard, "shard.tar", tuple(offsets))
        else:
            read_shard(data, f"fuzz-{base.name}.tar", valid_index)
    except (ShardFormatError, ManifestError):
        return "error"
    return "samples"


_SHARD_FOR_INDEX: list[bytes] = [b""]
_SCRATCH = [""]


def fuzz(num_cases: int, seed: int, case_timeout_s: float, extra_mb: int) -> dict[str, Any]:
    """Run ``num_cases`` mutations; return outcome counts, failures and the slowest case.

    After set-up, the address space may grow by ``extra_mb`` at most (0: no cap), so a reader
    that believed a declared size and allocated it fails with MemoryError (a failure here).
    """
    rng = random.Random(seed)
    _SCRATCH[0] = tempfile.mkstemp(suffix=".tar")[1]
    inputs = bases()
    _SHARD_FOR_INDEX[0] = inputs[0].data
    for base in inputs:  # the unmutated inputs must read cleanly
        if run_case(base, base.data, base.offsets) != "samples":
            raise AssertionError(f"valid base {base.name} does not read")
    peak_before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if extra_mb:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
        limit = used + (extra_mb << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    counts: dict[str, int] = {"samples": 0, "error": 0}
    failures: list[str] = []
    slowest = (0.0, "")

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    for case in range(num_cases):
        base = inputs[case % len(inputs)]
        description, data = mutate(base, rng)
        began = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, case_timeout_s)
        try:
            counts[run_case(base, data, base.offsets)] += 1
        except CaseTimeout:
            failures.append(f"case {case} ({base.name}, {description}): over {case_timeout_s} s")
        except Exception as error:  # the point: nothing else may escape
            failures.append(f"case {case} ({base.name}, {description}): {error!r}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        elapsed = time.perf_counter() - began
        slowest = max(slowest, (elapsed, f"case {case} ({base.name}, {description})"))
    growth_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - peak_before_mb
    return {"counts": counts, "failures": failures, "slowest": slowest, "rss_growth_mb": growth_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-timeout-s", type=float, default=2.0)
    parser.add_argument(
        "--extra-memory-mb", type=int, default=0, help="address space allowed after set-up"
    )
    args = parser.parse_args()
    print(json.dumps(fuzz(args.cases, args.seed, args.case_timeout_s, args.extra_memory_mb)))


if __name__ == "__main__":
    main()
