"""``shardstream inspect``: summarize a dataset's manifest.

``shardstream bench``: throughput and where the time goes, on your own data."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from shardstream._cli.common import (
    DeprecatedFlag,
    add_common,
    add_storage_options,
    counting,
    human,
    progress_updates,
    shown,
    storage_options,
)
from shardstream._storage import Store

__all__ = [
    "add_bench",
    "add_inspect",
]


def add_inspect(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="summarize a dataset's manifest")
    parser.add_argument("dest")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument(
        "--at-version", dest="version", type=int, default=None, metavar="N",
        help="inspect version N of a dataset that grew (default: the newest)",
    )  # fmt: skip
    parser.add_argument(  # the earlier spelling, which --version now means everywhere else
        "--version", dest="version", type=int, action=DeprecatedFlag, help=argparse.SUPPRESS,
        replacement="--at-version",
    )  # fmt: skip
    parser.add_argument(
        "--classes", type=int, default=0, metavar="N",
        help="count samples per class in N shards spread over the dataset (reads them)",
    )  # fmt: skip
    add_storage_options(parser)
    parser.set_defaults(handler=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from shardstream._catalog.shardlist import read_dataset

    store, manifest = read_dataset(args.dest, storage_options(args), version=args.version)
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
        f"samples:  {manifest.num_samples}{_excluded(manifest)}",
        *_versions(store, manifest.version),
        f"bytes:    {manifest.num_bytes} ({human(manifest.num_bytes)}){_per_sample(manifest)}",
        *_images(store, manifest),
        f"classes:  {len(names)} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        if names
        else "classes:  none",
        f"skipped:  {len(manifest.skipped)}",
        *_fields(manifest),
        f"created:  {manifest.created_by} (format {manifest.format_version})",
        "settings: " + json.dumps(dict(manifest.settings), sort_keys=True),
        *_details(store, manifest, args.classes, args.quiet),
    ]
    print("\n".join(lines))
    return 0


def _per_sample(manifest: Any) -> str:
    """Bytes on disk per sample, tar headers and the other members included."""
    if not manifest.num_samples:
        return ""
    return f", {human(manifest.num_bytes / manifest.num_samples)} per sample"


def _images(store: Store, manifest: Any) -> list[str]:
    """How images are stored, for a dataset built with ``--pixels`` (sizes from one index)."""
    from shardstream._format.inspection import pixel_sizes

    pixels = manifest.settings.get("pixels")
    if pixels is None:
        return []
    lines = [
        f"images:   pixels {pixels}: uint8 height x width x 3 in KEY.pixels.npy, decoded at "
        "build time (readers crop them without a JPEG decode)"
    ]
    sizes = pixel_sizes(store, manifest)
    if sizes is not None:
        (low_h, high_h), (low_w, high_w) = sizes["height"], sizes["width"]
        lines.append(
            f"  sizes in {sizes['shard']}'s index ({sizes['samples']} samples): height "
            f"{low_h}..{high_h}, width {low_w}..{high_w}"
        )
    return lines


def _versions(store: Store, shown_version: int) -> list[str]:
    """The dataset's readable versions with their sample counts (one line per version)."""
    from shardstream._catalog.versions import list_versions, read_version

    lines = [f"version:  {shown_version}"]
    versions = list_versions(store)
    for number in versions:
        manifest = read_version(store, number)
        lines.append(
            f"  version {number}: {manifest.num_samples} samples in {len(manifest.shards)} "
            f"shards{_by_version(manifest)}{' (published)' if number == versions[-1] else ''}"
        )
    return lines


def _fields(manifest: Any) -> list[str]:
    """The attached fields, their types and where they came from (``shardstream attach``)."""
    if manifest.columns is None:
        return []
    names = ", ".join(f"{name} ({kind})" for name, kind in manifest.columns.fields.items())
    attach = manifest.settings.get("attach") or {}
    table = f" from {attach['table']}" if attach.get("table") else ""
    made = manifest.columns.folder.rpartition("/v")[2].lstrip("0") or "0"
    return [f"fields:   {names} (attached by version {made}{table}; `view --where` selects)"]


def _excluded(manifest: Any) -> str:
    """How many stored samples the version excludes (they stay in the files until compact)."""
    if manifest.exclusions is None:
        return ""
    stored = manifest.num_samples + len(manifest.exclusions)
    if manifest.view is not None:
        return f" (of {stored} in the source's shards)"
    return (
        f" ({stored} stored, {len(manifest.exclusions)} excluded; `shardstream compact` "
        "removes their bytes)"
    )


def _by_version(manifest: Any) -> str:
    """What the version itself left out, when it was made by ``exclude``."""
    if manifest.exclusions is None:
        return ""
    own = int((manifest.exclusions.versions == manifest.version).sum())
    return f", {own} excluded by it" if own else ""


def _details(store: Store, manifest: Any, classes: int, quiet: bool) -> list[str]:
    """Per-shard spread, files other tools read, and (with ``--classes``) class balance."""
    from shardstream._format.inspection import class_balance, companion_files, shard_spread

    spread = shard_spread(manifest)
    samples, sizes = spread["samples"], spread["bytes"]
    lines = [
        f"per shard: samples min {samples['min']:.0f} / median {samples['median']:.0f} / max "
        f"{samples['max']:.0f}; bytes min {human(sizes['min'])} / median "
        f"{human(sizes['median'])} / max {human(sizes['max'])}",
        f"indexed:  {manifest.shards.num_indexed} of "
        f"{len(manifest.shards)} shards (ranged reads, memory maps, random access)",
    ]
    files = companion_files(store)
    lines += [f"files:    {name}: {reader}" for name, reader in files.items()] or [
        "files:    no _info.json (timm), README.md or dataset_info.json (Hugging Face)"
    ]
    if classes > 0 and len(manifest.shards):
        with counting(quiet, "shards", "reading labels") as progress:
            balance = class_balance(store, manifest, classes, progress)
        counts = balance["counts"]
        estimate = "" if balance["shards_read"] == balance["shards"] else " (estimate)"
        where = f"{balance['shards_read']} of {balance['shards']} shards"
        if counts:
            values = sorted(counts.values())
            lines.append(
                f"classes:  {len(counts)} labels in {where}{estimate}: samples per class min "
                f"{values[0]} / median {values[len(values) // 2]} / max {values[-1]}; "
                f"{balance['unlabelled']} unlabelled"
            )
        else:
            lines.append(f"classes:  no .cls labels in {where}")
    return lines


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
    from shardstream.streaming._options import StreamOptions

    stream = StreamOptions(storage_options=storage_options(args))
    if args.shuffle:
        from shardstream.streaming._diagnostics.mixcheck import (
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
    from shardstream.streaming._diagnostics.bench import BenchOptions, format_report, run_bench

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
