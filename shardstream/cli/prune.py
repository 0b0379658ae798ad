"""``shardstream prune``: remove old versions of a dataset that grew (never a shard)."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import add_storage_options, shown, storage_options
from shardstream.storage import Store

__all__ = ["add_prune"]


def add_prune(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prune", help="remove old versions' manifests of a dataset that grew (shards stay)"
    )
    parser.add_argument("dest")
    parser.add_argument(
        "--keep", type=int, default=1, metavar="N",
        help="versions to keep, newest first; the published one always stays (default: 1)",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_prune)


def _run_prune(args: argparse.Namespace) -> int:
    from shardstream.catalog.versions import list_versions, prune_versions
    from shardstream.errors import ConfigError

    if args.keep < 1:
        raise ConfigError(f"--keep must be at least 1 (the published version), got {args.keep}")
    store = Store(args.dest, storage_options(args))
    removed = prune_versions(store, keep=args.keep)
    kept = list_versions(store)
    print(
        f"{shown(args)}: removed versions {removed or 'none'}; readable versions {kept} "
        "(shards are shared by every version and stay)"
    )
    return 0
