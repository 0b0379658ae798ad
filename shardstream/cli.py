"""The ``shardstream`` command line: ``build``, ``inspect`` and ``verify``.

Each subcommand is one ``_add_*`` function registering its parser and a handler returning the
exit status; add a subcommand by appending to ``SUBCOMMANDS``. Every subcommand takes
``--storage-option KEY=VALUE`` (repeatable) for remote URLs; what the command line prints
(summaries, errors, log lines) goes through :mod:`shardstream.storage.redact`, so secrets passed
that way, or in a URL, never appear in its output.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shardstream.errors import ShardstreamError
from shardstream.storage import Store, redact_text, redact_url, secret_values

__all__ = ["SUBCOMMANDS", "main", "parse_size", "parse_storage_option"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256000000, ``"1GiB"`` -> 1073741824, ``"1000000"`` -> 1000000."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}; use bytes or a unit, e.g. 256MB, 1GiB, 1000000"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_storage_option(text: str) -> tuple[str, Any]:
    """``"anon=false"`` -> ``("anon", False)``; a value that is not JSON stays a string.

    Example:
        >>> parse_storage_option("endpoint_url=http://127.0.0.1:9000")
        ('endpoint_url', 'http://127.0.0.1:9000')
        >>> parse_storage_option('config_kwargs={"max_pool_connections": 64}')
        ('config_kwargs', {'max_pool_connections': 64})
    """
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(
            "invalid storage option (the value is not shown); expected KEY=VALUE, e.g. "
            "endpoint_url=http://127.0.0.1:9000 or anon=false"
        )
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def _add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        dest="storage_options",
        action="append",
        type=parse_storage_option,
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for remote URLs, repeatable; VALUE is parsed as JSON when it "
        "parses, e.g. endpoint_url=http://127.0.0.1:9000 anon=false",
    )


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    return dict(args.storage_options) or None


def _shown(args: argparse.Namespace) -> str:
    """DEST as it may be printed: without userinfo, signatures or option secrets."""
    return redact_text(redact_url(args.dest), secret_values(_storage_options(args)))


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if num_bytes < 1000 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1000
    return f"{num_bytes:.1f} TB"


def _add_build(subparsers: Any) -> None:
    parser = subparsers.add_parser("build", help="pack an image folder or list into tar shards")
    parser.add_argument("source", help="ImageFolder directory, or a .csv/.jsonl list")
    parser.add_argument("dest", help="output folder or fsspec URL")
    parser.add_argument(
        "--max-samples-per-shard", type=int, default=None, metavar="N",
        help="most samples per shard (default: limited by bytes only)",
    )
    parser.add_argument(
        "--max-bytes-per-shard", type=parse_size, default="256MB", metavar="SIZE",
        help="most bytes per shard, e.g. 256MB or 1GiB (default: 256MB)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N",
        help="worker processes; the output is identical for any N (default: 1)",
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle seed (default: 0)")
    order.add_argument("--no-shuffle", action="store_true", help="keep source order")
    parser.add_argument(
        "--resize", type=int, default=None, metavar="SHORTER_SIDE",
        help="shrink images to this shorter side and write JPEG (default: original bytes)",
    )
    parser.add_argument(
        "--quality", type=int, default=None, metavar="Q",
        help="JPEG quality when re-encoding, 1-100 (default: 90 with --resize)",
    )
    parser.add_argument(
        "--on-error", choices=("raise", "skip"), default="raise",
        help="stop at a corrupt file, or skip it and list it in the manifest (default: raise)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace what DEST holds")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_storage_options(parser)
    parser.set_defaults(handler=_run_build)


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
        on_error=args.on_error,
        overwrite=args.overwrite,
    )
    bar = _progress_bar(args.quiet)
    try:
        manifest = build_shards(
            args.source,
            args.dest,
            options,
            storage_options=_storage_options(args),
            progress=bar.update if bar else None,
        )
    finally:
        if bar:
            bar.close()
    print(
        f"{_shown(args)}: {manifest.num_samples} samples in {len(manifest.shards)} shards, "
        f"{_human(manifest.num_bytes)}; {len(manifest.skipped)} skipped"
    )
    return 0


class _Bar:
    """tqdm over files, with MB/s in the postfix (ETA comes from the file count)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        # No monitor thread: a single-threaded builder may fork its workers (see execute.py).
        tqdm.monitor_interval = 0
        self._bar = tqdm(unit="files", dynamic_ncols=True, file=sys.stderr)

    def update(
        self, items: int, num_bytes: int, total: int | None, total_bytes: int | None
    ) -> None:
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(items - self._bar.n)
        elapsed = self._bar.format_dict.get("elapsed") or 0.0
        if elapsed:
            self._bar.set_postfix_str(f"{num_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

    def close(self) -> None:
        self._bar.close()


def _progress_bar(quiet: bool) -> _Bar | None:
    return None if quiet or not sys.stderr.isatty() else _Bar()


def _add_inspect(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="summarize a dataset's manifest")
    parser.add_argument("dest")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    _add_storage_options(parser)
    parser.set_defaults(handler=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from shardstream.format.manifest import read_manifest

    manifest = read_manifest(Store(args.dest, _storage_options(args)))
    if args.json:
        sys.stdout.write(manifest.to_json())
        return 0
    names = manifest.class_names
    lines = [
        f"dataset:  {_shown(args)}",
        f"shards:   {len(manifest.shards)} ({manifest.shards[0].name} .. "
        f"{manifest.shards[-1].name})"
        if manifest.shards
        else "shards:   0",
        f"samples:  {manifest.num_samples}",
        f"bytes:    {manifest.num_bytes} ({_human(manifest.num_bytes)})",
        f"classes:  {len(names)} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        if names
        else "classes:  none",
        f"skipped:  {len(manifest.skipped)}",
        f"created:  {manifest.created_by} (format {manifest.format_version})",
        "settings: " + json.dumps(dict(manifest.settings), sort_keys=True),
    ]
    print("\n".join(lines))
    return 0


def _add_verify(subparsers: Any) -> None:
    parser = subparsers.add_parser("verify", help="re-read every shard and check it")
    parser.add_argument("dest")
    _add_storage_options(parser)
    parser.set_defaults(handler=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from shardstream.format.manifest import read_manifest
    from shardstream.format.verify import find_problems

    store = Store(args.dest, _storage_options(args))
    manifest = read_manifest(store)
    problems = find_problems(store, manifest)
    for problem in problems:
        print(f"MISMATCH {problem}")
    if problems:
        print(
            f"{_shown(args)}: {len(problems)} problem(s) in {len(manifest.shards)} shards",
            file=sys.stderr,
        )
        return 1
    print(f"{_shown(args)}: OK, {len(manifest.shards)} shards, {manifest.num_samples} samples")
    return 0


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_build, _add_inspect, _add_verify]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 mismatch/error, 2 usage)."""
    parser = argparse.ArgumentParser(prog="shardstream", description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    args = parser.parse_args(argv)
    secrets = secret_values(_storage_options(args))
    _configure_logging(args.verbose, secrets)
    try:
        return int(args.handler(args))
    except ShardstreamError as error:
        print(f"error: {redact_text(str(error), secrets)}", file=sys.stderr)
        return 1
    except OSError as error:  # storage refused or failed (missing bucket, access denied...)
        shown = redact_text(f"{type(error).__name__}: {error}", secrets)
        print(f"error: {shown}. Check the URL and --storage-option values.", file=sys.stderr)
        return 1


class _RedactingFormatter(logging.Formatter):
    """Formats log records, then masks URL secrets and the given literal secrets."""

    def __init__(self, fmt: str, secrets: Sequence[str]) -> None:
        super().__init__(fmt)
        self._secrets = tuple(secrets)

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record), self._secrets)


def _configure_logging(verbose: bool, secrets: Sequence[str]) -> None:
    """Log to stderr through a redacting formatter (library messages may quote URLs)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_RedactingFormatter("%(levelname)s %(name)s: %(message)s", secrets))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


if __name__ == "__main__":
    sys.exit(main())
