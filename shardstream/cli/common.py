"""What every subcommand shares: sizes, storage options, redaction, progress bars."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from shardstream.storage import redact_text, redact_url, secret_values

__all__ = [
    "Bar",
    "add_storage_options",
    "human",
    "parse_size",
    "parse_storage_option",
    "progress_bar",
    "shown",
    "storage_options",
]

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


def add_storage_options(parser: argparse.ArgumentParser) -> None:
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


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    return dict(args.storage_options) or None


def shown(args: argparse.Namespace) -> str:
    """DEST as it may be printed: without userinfo, signatures or option secrets."""
    return redact_text(redact_url(args.dest), secret_values(storage_options(args)))


def human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if num_bytes < 1000 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1000
    return f"{num_bytes:.1f} TB"


class Bar:
    """tqdm over items (files, shards), with MB/s in the postfix (ETA from the item count)."""

    def __init__(self, unit: str = "files") -> None:
        from tqdm import tqdm

        # No monitor thread: a single-threaded builder may fork its workers (see execute.py).
        tqdm.monitor_interval = 0
        self._bar = tqdm(unit=unit, dynamic_ncols=True, file=sys.stderr)

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


def progress_bar(quiet: bool, unit: str = "files") -> Bar | None:
    """A progress bar on a terminal's stderr, unless ``quiet``."""
    return None if quiet or not sys.stderr.isatty() else Bar(unit)


@contextlib.contextmanager
def progress_updates(
    quiet: bool, unit: str = "files"
) -> Iterator[Callable[[int, int, int | None, int | None], None] | None]:
    """A progress bar's ``update`` for the block (None when quiet or not a terminal), closed
    after it, also on errors."""
    bar = progress_bar(quiet, unit)
    try:
        yield bar.update if bar else None
    finally:
        if bar:
            bar.close()


def add_common(parser: argparse.ArgumentParser, handler: Callable[[Any], int]) -> None:
    """The options every command that reads or writes storage takes, and its handler."""
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_storage_options(parser)
    parser.set_defaults(handler=handler)
