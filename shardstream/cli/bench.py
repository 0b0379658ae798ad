"""``shardstream bench``: throughput and where the time goes, on your own data."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from shardstream.cli.common import add_common, progress_updates, storage_options

__all__ = ["add_bench"]


def add_bench(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="run the loader on a dataset and show where the time goes"
    )
    parser.add_argument("dataset", help="dataset folder or URL, shard pattern, or .txt list")
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument(
        "--mode", choices=("train", "raw"), default="train",
        help="train: decode + RandomResizedCrop 224 + flip + normalize; raw: bytes only",
    )  # fmt: skip
    parser.add_argument("--batches", type=int, default=None, metavar="N", help="stop after N")
    parser.add_argument("--seconds", type=float, default=30.0, help="stop after about S s")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument(
        "--shuffle", action="store_true",
        help="measure how mixed the batches are against a random permutation (reads labels)",
    )  # fmt: skip
    parser.add_argument(
        "--label", metavar="KEY", default=None,
        help="with --shuffle: the member holding the class (default: .cls/.label/.class)",
    )  # fmt: skip
    parser.add_argument(
        "--ranks", type=int, default=1, metavar="N",
        help="with --shuffle: split the epoch over N ranks and read rank 0",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="with --shuffle: the loader's seed")
    parser.add_argument(
        "--on-error", choices=("raise", "skip"), default="raise",
        help="stop at a missing or broken shard or sample, or skip and count it (default: raise)",
    )  # fmt: skip
    add_common(parser, _run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from shardstream.streaming.options import StreamOptions

    stream = StreamOptions(storage_options=storage_options(args))
    if args.shuffle:
        from shardstream.streaming.diagnostics.mixcheck import (
            MixCheckOptions,
            check_mix,
            format_mix_report,
        )

        mix = MixCheckOptions(
            workers=args.workers, batch_size=args.batch_size, world_size=args.ranks,
            batches=args.batches, label=args.label, seed=args.seed, on_error=args.on_error,
        )  # fmt: skip
        title = (f"{args.dataset}: batches of {args.batch_size}, {args.workers} workers, "
                 f"rank 0 of {args.ranks}, seed {args.seed}")  # fmt: skip
        return _report(
            args,
            lambda progress: check_mix(args.dataset, mix, stream_options=stream, progress=progress),
            title,
            format_mix_report,
        )
    from shardstream.streaming.diagnostics.bench import BenchOptions, format_report, run_bench

    options = BenchOptions(
        workers=args.workers, batch_size=args.batch_size, mode=args.mode,
        batches=args.batches, seconds=args.seconds, on_error=args.on_error,
    )  # fmt: skip
    title = f"{args.dataset}: {args.mode}, {args.workers} workers, batch {args.batch_size}"
    return _report(
        args,
        lambda progress: run_bench(args.dataset, options, stream_options=stream, progress=progress),
        title,
        format_report,
    )


def _report(
    args: argparse.Namespace,
    measure: Callable[[Callable[[int], None] | None], dict[str, Any]],
    title: str,
    format_summary: Callable[[dict[str, Any]], str],
) -> int:
    """Run ``measure`` with a progress bar, then print its summary as JSON or a table."""
    with progress_updates(args.quiet or args.json, unit="batches") as update:
        summary = measure((lambda done: update(done, 0, args.batches, None)) if update else None)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(title)
        print(format_summary(summary))
    return 0
