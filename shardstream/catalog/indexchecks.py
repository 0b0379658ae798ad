"""What ``index`` refuses or warns about once every shard was scanned: what breaks exactness
(unreadable shards, samples split across shards, keys that come back, stray members) and
gzipped shards, which are counted but cannot be read by byte range."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from shardstream.errors import SourceError
from shardstream.format.manifest import MANIFEST_NAME
from shardstream.format.tarreader import is_gzip_name
from shardstream.storage import Store

__all__ = ["STATE_FOLDER", "log_compressed", "refuse_inexact"]

logger = logging.getLogger("shardstream.catalog.indexer")

STATE_FOLDER = "_shardstream_index"


def refuse_inexact(
    records: dict[int, dict[str, Any]], shards: Store, target: Store, allow_extra_members: bool
) -> None:
    """Raise, listing them, on what would break exact epochs; forget the unreadable shards'
    batches, so that a run after fixing them reads them again."""
    entries = [entry for number in sorted(records) for entry in records[number]["entries"]]
    problems: list[str] = []
    for entry in entries:
        problems += entry["problems"]
        if entry["skipped"] and not allow_extra_members:
            problems.append(
                f"{shards.shown(entry['name'])}: {entry['skipped']} file member(s) that belong to "
                f"no sample (other readers may read them otherwise), such as "
                f"{entry['skipped_example']!r}"
            )
    for before, after in itertools.pairwise(entries):
        if before["last_key"] and before["last_key"] == after["first_key"]:
            problems.append(
                f"sample {before['last_key']!r} is split across {before['name']} and "
                f"{after['name']}: readers would see two samples"
            )
    if problems:
        kept = _forget_unreadable(records, target)
        shown = "\n  ".join(problems[:10]) + ("\n  ..." if len(problems) > 10 else "")
        back = any("comes back" in problem for problem in problems)
        hint = " Shards made with GNU tar keep a sample's files together with `tar --sort=name`."
        hint = hint if back else ""
        raise SourceError(
            f"{shards.shown()}: {len(problems)} problem(s) would break exact epochs:\n  {shown}\n"
            "Fix or leave out those shards (or pass allow_extra_members=True when only "
            f"members outside samples are listed), then run the same command again.{hint}{kept}"
        )


def _forget_unreadable(records: dict[int, dict[str, Any]], target: Store) -> str:
    """Forget the batches with problems (their indexes too, where no manifest names them), so
    that a run after fixing them reads them again; remove the run's state when nothing else
    is left to resume. Returns what the message says about the batches kept."""
    state = target.child(STATE_FOLDER)
    fresh = not target.exists(MANIFEST_NAME)  # else an index may be the manifest's
    for number, record in list(records.items()):
        if any(entry["problems"] for entry in record["entries"]):
            state.remove(f"task-{number:06d}.json")
            del records[number]
            for index in (entry["index"] for entry in record["entries"] if fresh):
                if index:
                    target.remove(index)
    if not records:
        state.remove_folder()
        return ""
    done = sum(len(record["entries"]) for record in records.values())
    return (
        f" The {done} shard(s) read without problems are remembered in "
        f"{state.shown()}, so that run reads only the others."
    )


def log_compressed(entries: list[dict[str, Any]], target: Store) -> None:
    compressed = [entry["name"] for entry in entries if is_gzip_name(entry["name"])]
    if compressed:
        logger.warning(
            "%s: %d gzipped shard(s) such as %s are counted but cannot be read by byte range "
            "(each piece reads its shard from the start); re-pack them as plain .tar for "
            "ranged reads and memory maps", target.shown(), len(compressed), compressed[0],
        )  # fmt: skip
