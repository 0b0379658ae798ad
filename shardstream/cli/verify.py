"""``shardstream verify``: re-read every shard and check it against the manifest."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardstream.cli.common import add_storage_options, counting, shown, storage_options

__all__ = ["add_verify"]


def add_verify(subparsers: Any) -> None:
    parser = subparsers.add_parser("verify", help="re-read every shard and check it")
    parser.add_argument("dest")
    add_storage_options(parser)
    parser.set_defaults(handler=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from shardstream.catalog.shardlist import read_dataset
    from shardstream.format.verify import find_problems

    store, manifest = read_dataset(args.dest, storage_options(args))
    total = len(manifest.shards)
    with counting(args.quiet, "shards", "verifying") as progress:
        problems = find_problems(
            store, manifest, None if progress is None else lambda done: progress(done, total)
        )
    for problem in problems:
        print(f"MISMATCH {problem}")
    if problems:
        print(
            f"{shown(args)}: {len(problems)} problem(s) in {len(manifest.shards)} shards",
            file=sys.stderr,
        )
        return 1
    print(f"{shown(args)}: OK, {len(manifest.shards)} shards, {manifest.num_samples} samples")
    return 0
