"""Remote rows of the shuffle benchmark: the class-ordered shards read from a real HTTP server.

The shards are served by the project's Range-capable HTTP/1.1 server
(``tests/stores/httpserver.py``, on 127.0.0.1, in this process) and read through
``http://`` URLs with shardstream's defaults, so the loader picks its remote order by itself.
The server logs every request it answers (method, path, ``Range``); the bytes of each shard GET
are what the server sent for it (its range, cut at the shard's end), so the mean request size
is measured, not taken from the plan. The cached row keeps whole shards in a local cache folder
(``ReadOptions(cache_dir=..., cache_max_bytes=...)``, the limit holding the dataset; empty at
the start of each run: the epoch measured is the one that downloads them), so the loader picks
the local order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _peer_runs import PeerRun

from tests.stores.httpserver import RangeServer

#: The cached row's cache limit: holds the benchmark's 395 MB (the local order needs a limit).
CACHE_BYTES = 4 << 30
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
#: Remote rows: name and the loader's options (2 workers each, as every row).
ROWS = {
    "shardstream, remote (HTTP server), defaults": {},
    "shardstream, remote (HTTP server), 4 ranks x 2 workers": {"world": 4},
    "shardstream, remote (HTTP server), 4 ranks x 2 workers, shards cached": {
        "world": 4,
        "cached": True,
    },
    # Short reads that give every worker stream of this small dataset enough places to mix
    # (the guide's numbers): the other side of the trade-off, measured at the server.
    "shardstream, remote (HTTP server), 4 ranks x 2 workers, short reads": {
        "world": 4,
        "chunk_size": 256,
        "num_open": 512,
        "piece_size": 128,
        "block_size": 128,
    },
}


@contextlib.contextmanager
def served(root: Path) -> Iterator[RangeServer]:
    """The HTTP server on ``root`` (the benchmark's data folder), stopped on exit."""
    server = RangeServer(str(root))
    try:
        yield server
    finally:
        server.stop()


def answered(server: RangeServer, root: Path) -> tuple[int, float, int]:
    """``(shard GETs, their mean bytes, other requests)`` the server answered since it was
    last cleared."""
    sizes, other = [], 0
    for method, path, asked in list(server.requests):
        if method != "GET" or not path.endswith(".tar"):
            other += 1
            continue
        size = (root / path.lstrip("/")).stat().st_size
        found = _RANGE.match(asked or "")
        if found is None:
            sizes.append(size)
            continue
        first, last = int(found[1]), found[2]
        sizes.append(min(size, int(last) + 1 if last else size) - first)
    return len(sizes), (sum(sizes) / len(sizes) if sizes else 0.0), other


def remote_runs(run: Callable[..., PeerRun], root: Path, seed: int,
                wanted: Callable[[str], bool]) -> Iterator[PeerRun]:  # fmt: skip
    """Each wanted remote row's epoch, ``run(name, url, seed, **options)`` reading
    ``root/shardstream`` from the server, with what the server answered."""
    names = [name for name in ROWS if wanted(name)]
    if not names:
        return
    from shardstream._storage import ReadOptions

    with served(root) as server:
        for name in names:
            server.clear()
            options = dict(ROWS[name])
            with tempfile.TemporaryDirectory(prefix="shuffle-cache-") as cache:
                if options.pop("cached", False):
                    read = ReadOptions(cache_dir=cache, cache_max_bytes=CACHE_BYTES)
                    options["read_options"] = read
                found = run(name, f"{server.url}/shardstream", seed, **options)
            yield dataclasses.replace(found, requests=answered(server, root))
