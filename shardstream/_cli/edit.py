"""``shardstream exclude`` (leave samples out, as a new version, without rewriting a shard) and
``shardstream compact`` (rewrite the shards that hold excluded samples, without them).

``shardstream prune``: remove old versions of a dataset (and shard files only they list).

``shardstream attach``: add fields to samples by key, as a new version (tars untouched).

``shardstream view`` (a subset or split of a dataset, by key) and ``shardstream merge``
(one dataset from partitions built on a cluster).

``shardstream dups``: exact duplicate samples within a dataset and across datasets."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from shardstream._catalog.versions import DEFAULT_KEEP
from shardstream._cli.common import add_storage_options, counting, human, shown, storage_options
from shardstream._storage import Store
from shardstream.errors import ConfigError

__all__ = [
    "add_attach",
    "add_compact",
    "add_dups",
    "add_exclude",
    "add_merge",
    "add_prune",
    "add_view",
    "read_key_lines",
]


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
    from shardstream._catalog.exclude import exclude_samples
    from shardstream._format.manifest import read_manifest

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
    from shardstream._format.manifest import read_manifest
    from shardstream.shardwriter._compact import compact_dataset

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
    from shardstream._catalog.versions import (
        list_versions,
        prune_plan,
        prune_versions,
        views_reading,
    )
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


def add_attach(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "attach",
        help="attach a table's fields (Parquet, CSV or JSONL) to samples by key, as a new "
        "version; the shards stay as they are",
    )
    parser.add_argument("dest", help="the dataset folder or URL")
    parser.add_argument("table", help="a .parquet, .csv or .jsonl file: a key column and fields")
    parser.add_argument("--key", default="__key__", help="the table's key column (__key__)")
    parser.add_argument(
        "--type", dest="types", action="append", default=[], metavar="FIELD=TYPE",
        help="declare a column's type (an Arrow type name: int64, float64, string, bool), "
        "repeatable; a CSV column that mixes numbers and text is refused unless declared",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_attach)


def _run_attach(args: argparse.Namespace) -> int:
    from shardstream._catalog.attach import attach_columns
    from shardstream._format.manifest import read_manifest

    options = storage_options(args)
    types = dict(_declared(text) for text in args.types)
    before = read_manifest(args.dest, options)
    with counting(args.quiet, "shards", "writing fields") as progress:
        after = attach_columns(
            args.dest,
            args.table,
            args.key,
            types=types,
            storage_options=options,
            progress=progress,
        )
    if after.version == before.version:
        print(f"{shown(args)}: version {after.version} holds this table already; nothing done")
        return 0
    fields = after.settings.get("attach", {})
    names = ", ".join(f"{name} ({kind})" for name, kind in (after.columns.fields.items()
                                                            if after.columns else ()))  # fmt: skip
    print(
        f"{shown(args)}: version {after.version}: {fields.get('matched_samples', 0)} of "
        f"{after.num_samples + len(after.exclusions or ())} stored samples have a row; "
        f"fields {names}"
    )
    return 0


def _declared(text: str) -> tuple[str, str]:
    from shardstream.errors import ConfigError

    field, equals, kind = text.partition("=")
    if not equals or not field.strip() or not kind.strip():
        raise ConfigError(f"--type takes FIELD=TYPE such as score=float64, got {text!r}")
    return field.strip(), kind.strip()


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
    from shardstream._catalog.views import make_view, split_dataset

    options = storage_options(args)
    if args.split:
        pairs = [_share(part) for part in args.split.split(",")]
        shares = dict(pairs)
        if len(shares) < len(pairs):
            twice = next(name for name, _ in pairs if [n for n, _ in pairs].count(name) > 1)
            raise ConfigError(f"--split names {twice!r} twice; give each split one share")
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
    from shardstream._catalog.execute import merge_partitions

    manifest = merge_partitions(args.dest, args.partitions, storage_options=storage_options(args))
    parts = manifest.settings.get("partitions")
    print(f"{shown(args)}: merged {parts} partitions, {len(manifest.shards)} shards, "
          f"{manifest.num_samples} samples")  # fmt: skip
    return 0


def add_dups(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dups",
        help="exact duplicate samples (equal content digests) within a dataset and across "
        "datasets (train against val/test), from their indexes",
    )
    parser.add_argument("dest", help="the dataset to clean (the keys file lists its samples)")
    parser.add_argument("others", nargs="*", help="datasets to compare it with (val, test...)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--keys-out", metavar="FILE",
        help="write DEST's samples to drop as SHARD<TAB>KEY lines, for `shardstream exclude "
        "DEST --keys FILE`",
    )  # fmt: skip
    parser.add_argument(
        "--drop", choices=("extra", "leaked"), default="extra",
        help="extra: all but the first of each group (default); leaked: every DEST sample "
        "that another dataset also holds",
    )  # fmt: skip
    parser.add_argument("--examples", type=int, default=5, help="groups shown with their keys")
    parser.add_argument("--workers", type=int, default=1, help="local processes for the passes")
    parser.add_argument(
        "--work-dir", metavar="URL", help="where the passes write (default: a temporary folder)"
    )
    add_storage_options(parser)
    parser.set_defaults(handler=_run_dups)


def _run_dups(args: argparse.Namespace) -> int:
    from shardstream._catalog.dups import find_duplicates

    with counting(args.quiet, "tasks", "comparing digests") as progress:
        report = find_duplicates(
            [args.dest, *args.others], keys_out=args.keys_out, drop=args.drop,
            examples=args.examples, workers=args.workers, work_dir=args.work_dir,
            storage_options=storage_options(args), progress=progress,
        )  # fmt: skip
    if args.json:
        print(json.dumps(report.as_dict(), indent=1, sort_keys=True))
        return 0
    for number, item in enumerate(report.datasets):
        note = ""
        if item["read_whole"]:
            note = (
                f"; {item['read_whole']} shard(s) read whole (their indexes have no digests: "
                "`shardstream index --overwrite` stores them)"
            )
        print(
            f"{item['shown']}: {item['samples']} samples, {report.in_groups[number]} in groups, "
            f"{report.beyond_first[number]} beyond the first of each, {report.leaked[number]} "
            f"also in another dataset{note}"
        )
    print(
        f"groups:   {report.groups} of equal content (largest {report.largest}); "
        f"{report.crossing_groups} span datasets"
    )
    for example in report.examples:
        members = " | ".join(f"{m['dataset']} {m['shard']} {m['key']}" for m in example["members"])
        print(f"  {example['size']} x {example['digest'][:16]}: {members}")
    if args.keys_out:
        print(
            f"keys:     {report.keys_written} line(s) in {args.keys_out}; `shardstream exclude "
            f"{report.datasets[0]['shown']} --keys {args.keys_out}` leaves them out"
        )
    return 0
