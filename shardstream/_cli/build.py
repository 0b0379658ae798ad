"""``shardstream build``: pack an image folder or list into tar shards.

``shardstream index``: describe shards made by other tools, in place or into DEST.

``shardstream abandon``: remove what an unfinished append left, so the next one starts clean.

``shardstream verify``: re-read every shard and check it against the manifest."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardstream._cli.common import (
    add_common,
    add_storage_options,
    counting,
    human,
    parse_size,
    progress_updates,
    shown,
    storage_options,
)
from shardstream._storage import redact_text

__all__ = [
    "add_abandon",
    "add_build",
    "add_index",
    "add_verify",
]


def add_build(subparsers: Any) -> None:
    parser = subparsers.add_parser("build", help="pack an image folder or list into tar shards")
    parser.add_argument("source", help="ImageFolder directory, or a .csv/.jsonl list")
    parser.add_argument("dest", help="output folder or fsspec URL")
    parser.add_argument(
        "--max-samples-per-shard",
        type=int,
        default=None,
        metavar="N",
        help="most samples per shard (default: limited by bytes only)",
    )
    parser.add_argument(
        "--max-bytes-per-shard",
        type=parse_size,
        default="256MB",
        metavar="SIZE",
        help="most bytes per shard, e.g. 256MB or 1GiB (default: 256MB)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes; the output is identical for any N (default: 1)",
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle seed (default: 0)")
    order.add_argument("--no-shuffle", action="store_true", help="keep source order")
    parser.add_argument(
        "--resize",
        type=int,
        default=None,
        metavar="SHORTER_SIDE",
        help="shrink images to this shorter side and write JPEG (default: original bytes)",
    )
    parser.add_argument(
        "--quality",
        type=int,
        default=None,
        metavar="Q",
        help="JPEG quality when re-encoding, 1-100 (default: 90 with --resize)",
    )
    parser.add_argument(
        "--pixels",
        default=None,
        metavar="SIZE",
        help="store images decoded once, as uint8 pixels (KEY.pixels.npy), at SIZE: short=N "
        "(shorter side N, aspect kept) or WxH (a fixed box); readers skip the JPEG decode "
        "(default: encoded images)",
    )
    parser.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="stop at an unreadable file or an image that fails the check (signature and end "
        "marker for JPEG/PNG, header for others; not a full decode: `verify --decode` does "
        "that), or skip it and list it in the manifest (default: raise)",
    )
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--overwrite", action="store_true", help="replace what DEST holds")
    written.add_argument(
        "--append", action="store_true",
        help="add SOURCE's samples to the dataset in DEST as new shards and publish a new "
        "version of it (a rerun finishes an interrupted append)",
    )  # fmt: skip
    add_common(parser, _run_build)


def _run_build(args: argparse.Namespace) -> int:
    from shardstream.shardwriter import BuildOptions, build_shards

    options = BuildOptions(
        max_samples_per_shard=args.max_samples_per_shard,
        max_bytes_per_shard=args.max_bytes_per_shard,
        workers=args.workers,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        resize=args.resize,
        quality=args.quality,
        pixels=args.pixels,
        on_error=args.on_error,
        overwrite=args.overwrite,
        append=args.append,
    )
    with progress_updates(args.quiet) as update:
        manifest = build_shards(
            args.source, args.dest, options, storage_options=storage_options(args),
            progress=update,
        )  # fmt: skip
    version = f"version {manifest.version}: " if manifest.version > 1 else ""
    print(
        f"{shown(args)}: {version}{manifest.num_samples} samples in {len(manifest.shards)} shards, "
        f"{human(manifest.num_bytes)}; {len(manifest.skipped)} skipped"
    )
    return 0


def add_index(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index", help="index existing shards (webdataset, img2dataset, tar) for exact epochs"
    )
    parser.add_argument(
        "source",
        help="folder or URL of .tar/.tar.gz shards, a manifest file, a brace pattern, or a "
        ".txt list",
    )
    parser.add_argument(
        "dest", nargs="?", default=None,
        help="where the indexes and manifest go (default: next to the shards)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="parallel processes")
    parser.add_argument(
        "--no-checksum", action="store_true",
        help="skip the sha256 (faster; verify then cannot check bytes)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-extra-members", action="store_true",
        help="accept members that belong to no sample (every reader skips them)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="index again over a manifest")
    add_common(parser, _run_index)


def _run_index(args: argparse.Namespace) -> int:
    from shardstream._catalog.indexer import IndexOptions, index_shards

    options = IndexOptions(
        workers=args.workers, checksum=not args.no_checksum,
        allow_extra_members=args.allow_extra_members, overwrite=args.overwrite,
    )  # fmt: skip
    with progress_updates(args.quiet, unit="shards") as update:
        manifest = index_shards(
            args.source, args.dest, options, storage_options=storage_options(args),
            progress=update,
        )  # fmt: skip
    where = redact_text(args.dest or args.source)  # every secret this process was given
    print(
        f"{where}: indexed {len(manifest.shards)} shards, {manifest.num_samples} samples, "
        f"{human(manifest.num_bytes)}"
    )
    return 0


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
    from shardstream.shardwriter._append import abandon_append

    names = abandon_append(args.dest, storage_options(args), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    if not names:
        print(f"{shown(args)}: no unfinished append; nothing to remove")
        return 0
    print(f"{shown(args)}: {verb} what an unfinished append left:")
    for name in names:
        print(f"  {name}")
    return 0


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
    from shardstream._catalog.shardlist import read_dataset
    from shardstream._format.verify import find_problems

    store, manifest = read_dataset(args.dest, storage_options(args))
    total = len(manifest.shards)
    with counting(args.quiet, "shards", "verifying") as progress:
        problems = find_problems(
            store, manifest, None if progress is None else lambda done: progress(done, total)
        )
    for problem in problems:
        print(f"MISMATCH {problem}")
    if args.decode:
        from shardstream._format.verify import find_undecodable

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
