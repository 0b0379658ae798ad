"""One measurement of benchmarks/scale.py, run in a fresh process; prints one JSON line.

``python benchmarks/_scale_rows.py ROW ROOT --world W --workers N --rank R [--state PATH]``:

- ``save``: a loader's state half-way through epoch 0 (the same on every rank), written to
  ``--state``; its size;
- ``startup``: manifest + ``StreamingDataset`` + ``len``, its time and RSS over the imports;
- ``first``: the first batch of a fresh epoch, from ``iter(loader)``;
- ``resume``: the first batch after ``load_state_dict(--state)``, timed from that call (a
  state saved at another layout makes it an elastic restore).

Rows with a batch give its wall time and the CPU seconds the rank and its workers spent on it.

Rows with a batch also give the memory of the rank and of each of its DataLoader workers.
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402, F401 (a bare import is the baseline)

from shardstream.streaming import (  # noqa: E402
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
)

IMPORT_S = time.perf_counter() - _STARTED
BATCH = 256


def _cpu_s(process: psutil.Process) -> tuple[float, list[float]]:
    """CPU seconds of a process and of each live child (its DataLoader workers): the work,
    which a busy machine does not inflate as it does the wall time."""
    children = process.children(recursive=True)
    own, *workers = (sum(each.cpu_times()[:2]) for each in [process, *children])
    return own, workers


def _memory(result: dict) -> None:
    """The rank's RSS and PSS, and per worker its PSS and USS (pages only it holds)."""
    me = psutil.Process()
    workers = me.children(recursive=True)
    main = me.memory_full_info()
    result["rank_rss_mb"], result["rank_pss_mb"] = main.rss / 2**20, main.pss / 2**20
    infos = [worker.memory_full_info() for worker in workers]
    result["workers"] = len(infos)
    result["worker_pss_mb"] = max((info.pss for info in infos), default=0) / 2**20
    result["worker_uss_mb"] = max((info.uss for info in infos), default=0) / 2**20
    result["total_pss_mb"] = (main.pss + sum(info.pss for info in infos)) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("row", choices=["save", "startup", "first", "resume"])
    parser.add_argument("root")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--state", default="")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    process = psutil.Process()
    before = process.memory_info().rss
    started = time.perf_counter()
    options = StreamOptions(rank=args.rank, world_size=args.world)
    dataset = StreamingDataset(args.root, decode="raw", batch_size=BATCH, options=options)
    length = len(dataset)
    result = {
        "import_s": IMPORT_S, "startup_s": time.perf_counter() - started,
        "startup_mb": (process.memory_info().rss - before) / 2**20, "batches": length,
    }  # fmt: skip
    loader = StreamingDataLoader(dataset, num_workers=args.workers)
    if args.row == "save":
        state = loader.state_dict()
        state["consumed_batches"] = length // 2  # what the loader says after that many
        text = json.dumps(state)
        with open(args.state, "w") as stream:
            stream.write(text)
        result["state_bytes"] = len(text)
    elif args.row in ("first", "resume"):
        started, (cpu, _) = time.perf_counter(), _cpu_s(process)
        if args.row == "resume":
            with open(args.state) as stream:
                loader.load_state_dict(json.load(stream))
        batches = iter(loader)  # kept: its workers stay alive for the memory measurement
        batch = next(batches)
        result["first_batch_s"] = time.perf_counter() - started
        own, workers = _cpu_s(process)
        result["first_batch_cpu_s"] = own - cpu + sum(workers)
        # On idle cores the wall time is about the rank's work and its slowest worker's.
        result["critical_cpu_s"] = own - cpu + max(workers, default=0.0)
        result["batch_len"] = len(batch[0])
        _memory(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
