"""What every loading-benchmark row measures: CPU time and peak memory of a process tree."""

from __future__ import annotations

import contextlib
import resource
import threading

#: Samples per batch in every row.
BATCH = 64


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its children that have been waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class PeakRss:
    """Samples the summed RSS of this process and its children every 200 ms.

    Listing children scans /proc; doing it every 20 ms cost the measured process a visible share
    of a core and of the GIL, which slowed some loaders more than others.
    """

    def __init__(self) -> None:
        import psutil

        self.peak, self._stop = 0, threading.Event()
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for proc in [self._process, *self._process.children(recursive=True)]:
                with contextlib.suppress(Exception):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(0.2)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20
