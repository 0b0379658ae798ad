"""The ``shardstream`` command line: ``build``, ``index``, ``inspect``, ``verify``, ``prune``...

Each subcommand is a module with one ``add_*`` function registering its parser and a handler
returning the exit status; add a subcommand by appending to ``SUBCOMMANDS``. Every subcommand takes
``--storage-option KEY=VALUE`` (repeatable) for remote URLs; what the command line prints
(summaries, errors, log lines) goes through :mod:`shardstream.storage.redact`, so secrets passed
that way, or in a URL, never appear in its output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shardstream.cli.bench import add_bench
from shardstream.cli.build import add_build
from shardstream.cli.common import parse_size, parse_storage_option, storage_options
from shardstream.cli.index import add_index
from shardstream.cli.inspect import add_inspect
from shardstream.cli.prune import add_prune
from shardstream.cli.verify import add_verify
from shardstream.cli.views import add_merge, add_view
from shardstream.errors import ShardstreamError, StorageError
from shardstream.storage import redact_text, secret_values
from shardstream.storage.diagnose import explain

__all__ = ["SUBCOMMANDS", "main", "parse_size", "parse_storage_option"]

SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_build, add_inspect, add_verify, add_index, add_view, add_merge, add_bench, add_prune,
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 mismatch/error, 2 usage)."""
    parser = argparse.ArgumentParser(prog="shardstream", description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    args = parser.parse_args(argv)
    secrets = secret_values(storage_options(args))
    _configure_logging(args.verbose, secrets)
    try:
        return int(args.handler(args))
    except ShardstreamError as error:
        cause = error.__cause__ if isinstance(error, StorageError) else None
        fix = explain(cause, detail=False) if cause is not None else None
        shown = str(error) if fix is None else f"{error} -- {fix}"
        print(f"error: {redact_text(shown, secrets)}", file=sys.stderr)
        return 1
    except Exception as error:  # storage refused or failed: one line with the fitting fix
        line = explain(error)
        if line is None:
            raise  # not a storage failure: a bug, shown with its traceback
        print(f"error: {redact_text(line, secrets)}", file=sys.stderr)
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
