"""``shardstream exclude`` (leave samples out, as a new version, without rewriting a shard) and
``shardstream compact`` (rewrite the shards that hold excluded samples, without them)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from shardstream.cli.common import add_storage_options, counting, shown, storage_options
from shardstream.errors import ConfigError

__all__ = ["add_compact", "add_exclude", "read_key_lines"]


def add_exclude(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "exclude",
        help="publish a new version that leaves samples out (by key or position), without "
        "rewriting a shard; `compact` then removes their bytes",
    )
    parser.add_argument("dest", help="the dataset folder or URL")
    named = parser.add_mutually_exclusive_group(required=True)
    named.add_argument(
        "--keys", metavar="FILE",
        help="a text file ('-': stdin), one sample a line: KEY (every shard's index is read) "
        "or SHARD<TAB>KEY (only that shard's; what `shardstream dups --keys-out` writes)",
    )  # fmt: skip
    named.add_argument(
        "--positions", metavar="FILE",
        help="a text file of positions 0 .. N-1 of the published version, one a line",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_exclude)


def read_key_lines(path: str) -> tuple[list[str] | None, list[tuple[str, str]] | None]:
    """The keys of a keys file: bare keys, or ``(shard, key)`` pairs (lines with a tab).

    Raises:
        ConfigError: Some lines name a shard and others do not.
    """
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        lines = [line.rstrip("\r\n") for line in stream]
    finally:
        if stream is not sys.stdin:
            stream.close()
    lines = [line for line in lines if line.strip()]
    tabbed = sum("\t" in line for line in lines)
    if tabbed == 0:
        return [line.strip() for line in lines], None
    if tabbed != len(lines):
        raise ConfigError(
            f"{path}: {tabbed} of its {len(lines)} lines are SHARD<TAB>KEY and the others "
            "KEY; use one form for the whole file"
        )
    pairs = [tuple(line.split("\t", 1)) for line in lines]
    return None, [(shard.strip(), key.strip()) for shard, key in pairs]


def _read_positions(path: str) -> np.ndarray:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    try:
        return np.array(text.split(), dtype=np.int64)
    except ValueError:
        raise ConfigError(f"{path}: expected one integer position a line") from None


def _run_exclude(args: argparse.Namespace) -> int:
    from shardstream.catalog.exclude import exclude_samples
    from shardstream.format.manifest import read_manifest

    options = storage_options(args)
    before = read_manifest(args.dest, options)
    keys, pairs, positions = None, None, None
    if args.keys:
        keys, pairs = read_key_lines(args.keys)
    else:
        positions = _read_positions(args.positions)
    with counting(args.quiet, "shards", "reading indexes") as progress:
        after = exclude_samples(
            args.dest, keys, shard_keys=pairs, positions=positions, storage_options=options,
            progress=progress,
        )  # fmt: skip
    if after.version == before.version:
        print(f"{shown(args)}: nothing excluded; version {after.version} stays published")
        return 0
    stored = len(after.exclusions) if after.exclusions is not None else 0
    print(
        f"{shown(args)}: version {before.version} -> {after.version}: {before.num_samples} -> "
        f"{after.num_samples} samples ({before.num_samples - after.num_samples} excluded; "
        f"{stored} excluded samples are still stored until `shardstream compact`)"
    )
    return 0


def add_compact(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compact",
        help="publish a new version in which the shards holding excluded samples are "
        "rewritten without them; `prune --keep 1` then deletes the old files",
    )
    parser.add_argument("dest", help="the dataset folder or URL")
    parser.add_argument("--workers", type=int, default=4, help="shards rewritten at once")
    add_storage_options(parser)
    parser.set_defaults(handler=_run_compact)


def _run_compact(args: argparse.Namespace) -> int:
    from shardstream.format.manifest import read_manifest
    from shardstream.shardwriter.compact import compact_dataset

    options = storage_options(args)
    before = read_manifest(args.dest, options)
    with counting(args.quiet, "shards", "rewriting") as progress:
        after = compact_dataset(
            args.dest, workers=args.workers, storage_options=options, progress=progress
        )
    if after.version == before.version:
        print(f"{shown(args)}: excludes no samples; nothing to compact")
        return 0
    rewritten = sum(
        1 for old, new in zip(before.shards.names, after.shards.names, strict=True) if old != new
    )
    print(
        f"{shown(args)}: version {after.version}: {rewritten} shard(s) rewritten without "
        f"{len(before.exclusions or ())} excluded samples; `shardstream prune {shown(args)} "
        "--keep 1` deletes the old files once no job reads an older version"
    )
    return 0
