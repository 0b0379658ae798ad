"""``shardstream attach``: add fields to samples by key, as a new version (tars untouched)."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.cli.common import add_storage_options, counting, shown, storage_options

__all__ = ["add_attach"]


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
    from shardstream.catalog.attach import attach_columns
    from shardstream.format.manifest import read_manifest

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
