"""``shardstream verify``: re-read every shard and check it against the manifest."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardstream.cli.common import add_storage_options, counting, shown, storage_options

__all__ = ["add_verify"]


def add_verify(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="re-read every shard and check it against the manifest: sizes, sha256, counts, "
        "member layout, indexes (images are not decoded unless --decode)",
    )
    parser.add_argument("dest")
    parser.add_argument(
        "--decode", action="store_true",
        help="also decode every image member with Pillow, as training does: finds damage "
        "inside an image's data that the build's signature/end-marker check passes (slower: a "
        "full decode per image)",
    )  # fmt: skip
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
    if args.decode:
        from shardstream.format.decodecheck import find_undecodable

        with counting(args.quiet, "shards", "decoding") as progress:
            broken = find_undecodable(
                store, manifest, None if progress is None else lambda done: progress(done, total)
            )
        for problem in broken:
            print(f"UNDECODABLE {problem}")
        problems += broken
    if problems:
        print(
            f"{shown(args)}: {len(problems)} problem(s) in {len(manifest.shards)} shards",
            file=sys.stderr,
        )
        return 1
    decoded = ", every image decodes" if args.decode else ""
    print(f"{shown(args)}: OK, {len(manifest.shards)} shards, {manifest.num_samples} samples"
          f"{decoded}")  # fmt: skip
    return 0
