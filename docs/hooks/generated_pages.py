"""MkDocs hook: pages generated at build time from the files they describe, so none can drift.

- ``cli.md``: the marker ``<!-- cli-reference -->`` becomes each subcommand's ``--help`` text,
  from the real parsers.
- ``index.md`` and ``changelog.md``: the markers ``<!-- readme -->`` and ``<!-- changelog -->``
  become README.md and CHANGELOG.md, their links made relative to this site.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _help_text(parser: argparse.ArgumentParser) -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: a fixed width for the page
    return parser.format_help().rstrip()


def cli_reference() -> str:
    """Markdown for every subcommand: its one-line summary, then its full help in a block."""
    from shardstream._cli import make_parser

    parser = make_parser()
    parts = ["```text", _help_text(parser), "```"]
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        summaries = {choice.dest: choice.help for choice in action._choices_actions}
        for name, subparser in action.choices.items():
            parts += ["", f"## shardstream {name}", "", summaries.get(name) or "", ""]
            parts += ["```text", _help_text(subparser), "```"]
    return "\n".join(parts)


def _front_page() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    generated = {
        "cli.md": ("<!-- cli-reference -->", cli_reference),
        "index.md": ("<!-- readme -->", _front_page),
        "changelog.md": ("<!-- changelog -->",
                         lambda: (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")),
    }  # fmt: skip
    marker, make = generated.get(page.file.src_uri, ("", None))
    return markdown.replace(marker, make()) if make is not None else markdown


_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    """Docstrings name objects with Sphinx roles (``:class:`X```): show the name alone."""
    return _ROLE.sub("", html)
