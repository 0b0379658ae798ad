"""``shardstream index``: describe shards made by other tools, in place or into DEST."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import add_common, human, progress_updates, storage_options
from shardstream.storage import redact_text

__all__ = ["add_index"]


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
    from shardstream.catalog.indexer import IndexOptions, index_shards

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
