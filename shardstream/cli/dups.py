"""``shardstream dups``: exact duplicate samples within a dataset and across datasets."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.cli.common import add_storage_options, counting, storage_options

__all__ = ["add_dups"]


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
    from shardstream.catalog.dups import find_duplicates

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
