"""What every subcommand shares: sizes, storage options, redaction, progress bars."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Collection, Iterator
from typing import Any

from shardstream._storage import redact_text, redact_url, secret_values

__all__ = [
    "Bar",
    "DeprecatedFlag",
    "add_storage_options",
    "cli_spelling",
    "counting",
    "human",
    "parse_size",
    "parse_storage_option",
    "plain_help",
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


#: The library's messages name Python arguments; the command line shows its own flags.
_SPELLINGS = [
    (re.compile(r"\b(\w+)=(True|'\w+') \((--[\w-]+(?: \w+)?)\)"), r"\3"),
    (re.compile(r"\btypes=\{[^}]*\} \((--type [^)\s]+)\)"), r"\1"),
    (re.compile(r"\bon_error='skip'"), "--on-error skip"),
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    (re.compile(r"\bappend=True\b"), "--append"),
    (re.compile(r"\ballow_extra_members=True\b"), "--allow-extra-members"),
    (re.compile(r"\bwith version=None\b"), "without --at-version"),
    (re.compile(r"\bversion=(\d+)"), r"--at-version \1"),
]


def plain_help(docstring: str | None) -> str:
    """A docstring's first line as ``--help`` shows it: without reST markup.

    Examples:
        >>> plain_help("The ``shardstream`` command line: :func:`main`.")
        'The shardstream command line: main.'
    """
    line = (docstring or "").strip().splitlines()[0] if docstring else ""
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", line).replace("``", "")


#: Advice to pass a flag, up to the end of its sentence: cut where the command has no such flag.
_PASS_FLAG = re.compile(r",? or pass (--[\w-]+)[^.;]*")


def cli_spelling(text: str, flags: Collection[str] | None = None) -> str:
    """A library message with the command line's flags for the Python arguments it names.

    With ``flags`` (the running command's), advice to pass a flag it does not take is cut: the
    same library error reaches ``bench``, which takes ``--on-error``, and ``verify``, which
    does not.

    Examples:
        >>> cli_spelling("pass overwrite=True (--overwrite) to start over")
        'pass --overwrite to start over'
        >>> cli_spelling("fix the file, or pass on_error='skip'")
        'fix the file, or pass --on-error skip'
        >>> cli_spelling("x.tar: truncated. Re-copy it, or pass on_error='skip'.", {"--decode"})
        'x.tar: truncated. Re-copy it.'
    """
    for pattern, replacement in _SPELLINGS:
        text = pattern.sub(replacement, text)
    if flags is not None:
        text = _PASS_FLAG.sub(lambda found: found[0] if found[1] in flags else "", text)
    return text


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

    Examples:
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


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag: stores its value as the new one does, with a note on stderr.

    Examples:
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--old", dest="new", action=DeprecatedFlag,
        ...                         replacement="--new")
    """

    def __init__(self, *args: Any, replacement: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replacement = replacement

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        print(f"note: {option_string} is deprecated here; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        dest="storage_options",
        action="append",
        type=parse_storage_option,
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for remote URLs (s3://, gs://, az:// or abfs://, https:// (read "
        "only), any fsspec URL), repeatable; VALUE is parsed as JSON when it parses, e.g. "
        "endpoint_url=http://127.0.0.1:9000 anon=false",
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
    """tqdm over items (files, shards), with MB/s in the postfix (ETA from the item count).

    A bar over files is a build's: its updates without a total before the first with one are
    the scan of the source, counted as found, then the bar starts again at 0 of the total.
    """

    def __init__(self, unit: str = "files", description: str | None = None) -> None:
        from tqdm import tqdm

        # No monitor thread: a single-threaded builder may fork its workers (see execute.py).
        tqdm.monitor_interval = 0
        self._bar = tqdm(unit=unit, dynamic_ncols=True, file=sys.stderr, desc=description)
        self._scanning = False
        self._scans = unit == "files"

    def update(
        self, items: int, num_bytes: int, total: int | None, total_bytes: int | None
    ) -> None:
        if self._scans and total is None and (self._scanning or self._bar.n == 0):
            self._bar.set_description_str("scanning", refresh=not self._scanning)
            self._scanning = True
        elif self._scanning:
            self._scanning = False
            self._bar.set_description_str("writing", refresh=False)
            self._bar.reset(total=total)
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(items - self._bar.n)
        elapsed = self._bar.format_dict.get("elapsed") or 0.0
        if elapsed and num_bytes:
            self._bar.set_postfix_str(f"{num_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

    def close(self) -> None:
        self._bar.close()


def progress_bar(quiet: bool, unit: str = "files", description: str | None = None) -> Bar | None:
    """A progress bar on a terminal's stderr, unless ``quiet``."""
    return None if quiet or not sys.stderr.isatty() else Bar(unit, description)


@contextlib.contextmanager
def counting(
    quiet: bool, unit: str, description: str | None = None
) -> Iterator[Callable[[int, int], None] | None]:
    """``progress(done, total)`` of a bar over items of a known total, for the block (None
    when quiet or not a terminal)."""
    with progress_updates(quiet, unit, description) as update:
        yield None if update is None else (lambda done, total: update(done, 0, total, None))


@contextlib.contextmanager
def progress_updates(
    quiet: bool, unit: str = "files", description: str | None = None
) -> Iterator[Callable[[int, int, int | None, int | None], None] | None]:
    """A progress bar's ``update`` for the block (None when quiet or not a terminal), closed
    after it, also on errors."""
    bar = progress_bar(quiet, unit, description)
    try:
        yield bar.update if bar else None
    finally:
        if bar:
            bar.close()


def add_common(parser: argparse.ArgumentParser, handler: Callable[[Any], int]) -> None:
    """The options every command that reads or writes storage takes, and its handler
    (``--quiet`` and ``--verbose`` every subcommand takes: see :func:`shardstream._cli.main`)."""
    add_storage_options(parser)
    parser.set_defaults(handler=handler)
