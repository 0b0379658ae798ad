"""``shardstream build``: pack an image folder or list into tar shards."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import (
    add_common,
    human,
    parse_size,
    progress_updates,
    shown,
    storage_options,
)

__all__ = ["add_build"]


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
