"""``shardstream prune``: remove old versions of a dataset (and shard files only they list)."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.catalog.versions import DEFAULT_KEEP
from shardstream.cli.common import add_storage_options, human, shown, storage_options
from shardstream.storage import Store

__all__ = ["add_prune"]


def add_prune(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prune",
        help="remove old versions of a dataset: their manifests, and the shard files only "
        "they list (those `compact` replaced)",
    )
    parser.add_argument("dest")
    parser.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, metavar="N",
        help="versions to keep, newest first; the published one always stays (default: "
        f"{DEFAULT_KEEP}: the published one and the one before it, which jobs started before "
        "the last append read until their epoch ends). A job cannot resume an epoch whose "
        "version was removed",
    )  # fmt: skip
    parser.add_argument(
        "--dry-run", action="store_true",
        help="list the versions and files that would be removed, with their sizes, and the "
        "views (made with `shardstream view`) that would no longer read",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_prune)


def _run_prune(args: argparse.Namespace) -> int:
    from shardstream.catalog.versions import list_versions, prune_plan, prune_versions
    from shardstream.catalog.viewrecords import views_reading
    from shardstream.errors import ConfigError

    if args.keep < 1:
        raise ConfigError(f"--keep must be at least 1 (the published version), got {args.keep}")
    store = Store(args.dest, storage_options(args))
    plan = prune_plan(store, keep=args.keep)
    if not args.dry_run:
        prune_versions(store, keep=args.keep)
    kept = [version for version in list_versions(store) if version not in plan]
    files = {name: size for version_files in plan.values() for name, size in version_files.items()}
    verb = "would remove" if args.dry_run else "removed"
    count = f"{len(files)} file{'' if len(files) == 1 else 's'}"
    print(
        f"{shown(args)}: {verb} versions {list(plan) or 'none'} ({count}, "
        f"{human(sum(files.values()))}); readable versions {kept} (shards a readable version "
        "lists stay)"
    )
    for name, size in files.items():
        print(f"  {name}  {human(size)}")
    for view, version, lost in views_reading(store, files):
        print(
            f"view {view} (made of version {version}) {'will' if args.dry_run else 'can'} no "
            f"longer be read: it reads {lost}; make it again from version {max(kept)}"
        )
    return 0
