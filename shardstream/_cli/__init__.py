"""The ``shardstream`` command line: ``build``, ``index``, ``inspect``, ``exclude``, ``prune``...

Each subcommand is a module with one ``add_*`` function registering its parser and a handler
returning the exit status; add a subcommand by appending to ``SUBCOMMANDS``. Every subcommand takes
``--storage-option KEY=VALUE`` (repeatable) for remote URLs, and ``-v``/``-q`` before or after
its name; what the command line prints (summaries, errors, log lines) and any exception that
leaves it (with its causes) goes through :mod:`shardstream._storage.messages`, so secrets passed
that way, in a URL or in the environment, never appear in its output. Errors are one line, with
the command line's flags for the library's argument names.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardstream._cli.build import add_abandon, add_build, add_index, add_verify
from shardstream._cli.common import (
    cli_spelling,
    parse_size,
    parse_storage_option,
    plain_help,
    storage_options,
)
from shardstream._cli.edit import (
    add_attach,
    add_compact,
    add_dups,
    add_exclude,
    add_merge,
    add_prune,
    add_view,
)
from shardstream._cli.inspect import add_bench, add_inspect
from shardstream._storage import redact_text, secret_values
from shardstream._storage.messages import explain, redact_error, remember_secrets, url_secrets
from shardstream._version import __version__
from shardstream.errors import ShardNotFoundError, ShardstreamError, StorageError

__all__ = ["SUBCOMMANDS", "main", "parse_size", "parse_storage_option"]

SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_build, add_inspect, add_verify, add_index, add_view, add_merge, add_bench, add_prune,
    add_abandon, add_exclude, add_compact, add_dups, add_attach,
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 mismatch/error, 2 usage).

    Examples:
        >>> main(["inspect", "shards/train"])  # doctest: +SKIP
        0
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    flags = set(parser.commands[args.command]._option_string_actions)
    secrets = _secrets(args)
    remember_secrets(secrets)
    _configure_logging(args.verbose, secrets, flags)
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # a closed pipe (`| head`) fails here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _reader_went_away()
    except BaseException as error:
        redact_error(error, secrets)  # also what a traceback of a bug would show
        failed = _failed(error, secrets, flags)
        if failed is None:
            raise  # not a storage failure: a bug, shown with its traceback
        return failed


def _secrets(args: argparse.Namespace) -> list[str]:
    """The secrets on the command line: storage options, and user info in any URL argument."""
    found = secret_values(storage_options(args))
    for value in vars(args).values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str):
                found.extend(url_secrets(item))
    return found


def _failed(error: BaseException, secrets: Sequence[str], flags: set[str]) -> int | None:
    """Exit status 1 after one line on stderr for a failure a user can fix; None for a bug.
    The line names the command's ``flags`` for the library's arguments, and no others."""
    if isinstance(error, ShardstreamError):
        # A missing shard's message says what to do; other storage failures get the fix that
        # fits their cause (credentials, endpoint, permissions...).
        told = isinstance(error, ShardNotFoundError)
        cause = error.__cause__ if isinstance(error, StorageError) and not told else None
        fix = explain(cause, detail=False) if cause is not None else None
        shown = str(error) if fix is None else f"{error} -- {fix}"
        print(f"error: {redact_text(cli_spelling(shown, flags), secrets)}", file=sys.stderr)
        return 1
    # Storage refused or failed: one line with the fitting fix.
    line = explain(error) if isinstance(error, Exception) else None
    if line is None:
        return None
    print(f"error: {redact_text(line, secrets)}", file=sys.stderr)
    return 1


def make_parser() -> _Parser:
    """The parser of every subcommand; ``-v`` and ``-q`` work before or after its name."""
    parser = _Parser(prog="shardstream", description=plain_help(__doc__))
    parser.add_argument("--version", action="version", version=f"shardstream {__version__}")
    _add_output_flags(parser, False)
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for add in SUBCOMMANDS:
        add(subparsers)
    parser.commands = subparsers.choices
    for subparser in subparsers.choices.values():
        # SUPPRESS: a flag left out after the subcommand keeps the value given before it.
        _add_output_flags(subparser, argparse.SUPPRESS)
    return parser


class _Parser(argparse.ArgumentParser):
    """The top-level parser: an unknown flag gets the subcommand's closest one suggested."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: Mapping[str, argparse.ArgumentParser] = {}

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = self._suggestion(parsed, extras)
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _suggestion(self, parsed: argparse.Namespace, extras: Sequence[str]) -> str:
        command = self.commands.get(getattr(parsed, "command", None) or "")
        known = [*self._option_string_actions, *(command._option_string_actions if command else ())]
        return _closest_flag(extras, known)


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: when it stops at a missing argument before the top level sees
    the unknown ones (``view A B --fration 0.5``), it suggests the flag meant as well."""

    _given: Sequence[str] = ()

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = [str(arg) for arg in args] if args is not None else sys.argv[1:]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        known = list(self._option_string_actions)
        unknown = [
            given for given in self._given
            if not any(flag.startswith(given.partition("=")[0]) for flag in known)
        ]  # fmt: skip
        super().error(message + _closest_flag(unknown, known))


def _closest_flag(given: Sequence[str], known: Sequence[str]) -> str:
    """`` (did you mean --workers?)`` for the first ``--flag`` in ``given`` close to a known
    one, else ``""``."""
    for extra in given:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.partition("=")[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _add_output_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--verbose", "-v", action="store_true", default=default, help="log progress details"
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", default=default,
        help="no progress bars (they show only when stderr is a terminal)",
    )  # fmt: skip


def _reader_went_away() -> int:
    """``shardstream ... | head``: the reader closed the pipe; stop quietly, as tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the exit's flush must not fail again
    os.close(devnull)
    return 128 + signal.SIGPIPE


class _RedactingFormatter(logging.Formatter):
    """Formats log records with the command line's spellings, then masks URL secrets and the
    given literal secrets."""

    def __init__(self, fmt: str, secrets: Sequence[str], flags: set[str] | None = None) -> None:
        super().__init__(fmt)
        self._secrets = tuple(secrets)
        self._flags = flags

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(cli_spelling(super().format(record), self._flags), self._secrets)


def _configure_logging(verbose: bool, secrets: Sequence[str], flags: set[str]) -> None:
    """Log to stderr through a redacting formatter (library messages may quote URLs), with the
    command's ``flags`` for the library's argument names."""
    handler = logging.StreamHandler()
    formatter = _RedactingFormatter("%(levelname)s %(name)s: %(message)s", secrets, flags)
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
