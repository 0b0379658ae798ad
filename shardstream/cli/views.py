"""``shardstream view`` (a subset or split of a dataset, by key) and ``shardstream merge``
(one dataset from partitions built on a cluster)."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import add_storage_options, counting, shown, storage_options
from shardstream.errors import ConfigError

__all__ = ["add_merge", "add_view"]


def add_view(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "view", help="a subset or a train/val split of a dataset, without copying shards"
    )
    parser.add_argument("source", help="dataset folder or URL (built or indexed)")
    parser.add_argument("dest", help="folder or URL for the view (splits: one folder each)")
    rule = parser.add_mutually_exclusive_group(required=True)
    rule.add_argument("--fraction", type=float, help="keep about this fraction of the keys")
    rule.add_argument(
        "--split", metavar="NAME=SHARE,...", help="e.g. train=0.9,val=0.1: every key in one"
    )
    rule.add_argument("--keys", metavar="FILE", help="a text file of keys to keep, one a line")
    rule.add_argument(
        "--where", metavar="EXPR",
        help='keep the samples whose attached fields satisfy EXPR, e.g. "aesthetic >= 5"',
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw by key")
    add_storage_options(parser)
    parser.set_defaults(handler=_run_view)


def _run_view(args: argparse.Namespace) -> int:
    from shardstream.catalog.views import make_view, split_dataset

    options = storage_options(args)
    if args.split:
        shares = dict(_share(part) for part in args.split.split(","))
        with counting(args.quiet, "shards", "reading indexes") as progress:
            views = split_dataset(args.source, args.dest, shares, seed=args.seed,
                                  storage_options=options, progress=progress)  # fmt: skip
        for name, view in views.items():
            print(f"{shown(args)}/{name}: {view.num_samples} samples")
        return 0
    keys = None
    if args.keys:
        with open(args.keys, encoding="utf-8") as stream:
            keys = [line.strip() for line in stream if line.strip()]
    with counting(args.quiet, "shards", "reading indexes") as progress:
        view = make_view(args.source, args.dest, fraction=args.fraction, keys=keys,
                         where=args.where, seed=args.seed, storage_options=options,
                         progress=progress)  # fmt: skip
    print(f"{shown(args)}: {view.num_samples} samples")
    return 0


def _share(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError(text)
        return name.strip(), float(value)
    except ValueError:
        raise ConfigError(
            f"--split takes NAME=SHARE pairs such as train=0.9, got {text!r}"
        ) from None


def add_merge(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "merge", help="write the manifest of partitions built separately (write_partition)"
    )
    parser.add_argument("dest", help="the folder or URL the partitions were written into")
    parser.add_argument(
        "--partitions", type=int, default=None, metavar="N",
        help="how many partitions there must be (default: those found, without gaps)",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_merge)


def _run_merge(args: argparse.Namespace) -> int:
    from shardstream.catalog.partitionmerge import merge_partitions

    manifest = merge_partitions(args.dest, args.partitions, storage_options=storage_options(args))
    parts = manifest.settings.get("partitions")
    print(f"{shown(args)}: merged {parts} partitions, {len(manifest.shards)} shards, "
          f"{manifest.num_samples} samples")  # fmt: skip
    return 0
