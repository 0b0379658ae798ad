"""``shardstream abandon``: remove what an unfinished append left, so the next one starts clean."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import add_storage_options, shown, storage_options

__all__ = ["add_abandon"]


def add_abandon(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "abandon",
        help="remove an unfinished append's build state and the shards it wrote (the "
        "published version stays); the other way out of a killed append is to rerun it",
    )
    parser.add_argument("dest", help="the dataset folder or URL")
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    add_storage_options(parser)
    parser.set_defaults(handler=_run_abandon)


def _run_abandon(args: argparse.Namespace) -> int:
    from shardstream.shardwriter.abandon import abandon_append

    names = abandon_append(args.dest, storage_options(args), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    if not names:
        print(f"{shown(args)}: no unfinished append; nothing to remove")
        return 0
    print(f"{shown(args)}: {verb} what an unfinished append left:")
    for name in names:
        print(f"  {name}")
    return 0
