"""``shardstream inspect``: summarize a dataset's manifest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardstream.cli.common import add_storage_options, human, shown, storage_options
from shardstream.storage import Store

__all__ = ["add_inspect"]


def add_inspect(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="summarize a dataset's manifest")
    parser.add_argument("dest")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    add_storage_options(parser)
    parser.set_defaults(handler=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from shardstream.format.manifest import read_manifest

    manifest = read_manifest(Store(args.dest, storage_options(args)))
    if args.json:
        sys.stdout.write(manifest.to_json())
        return 0
    names = manifest.class_names
    lines = [
        f"dataset:  {shown(args)}",
        f"shards:   {len(manifest.shards)} ({manifest.shards[0].name} .. "
        f"{manifest.shards[-1].name})"
        if manifest.shards
        else "shards:   0",
        f"samples:  {manifest.num_samples}",
        f"bytes:    {manifest.num_bytes} ({human(manifest.num_bytes)})",
        f"classes:  {len(names)} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        if names
        else "classes:  none",
        f"skipped:  {len(manifest.skipped)}",
        f"created:  {manifest.created_by} (format {manifest.format_version})",
        "settings: " + json.dumps(dict(manifest.settings), sort_keys=True),
    ]
    print("\n".join(lines))
    return 0
