"""Helpers for tests that run real torch.distributed ranks in spawned processes."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any


def exit_rank_cleanly() -> None:
    """End a rank that finished its work and destroyed its process group, skipping C++ teardown.

    Rarely (about 1 run in 20 here), torch 2.15's gloo backend aborts a rank with "terminate
    called without an active exception" while C++ statics are destroyed after the interpreter
    has finished: after every result was written. Exiting with os._exit keeps that teardown bug
    from failing the test; any exception before this point still propagates to mp.spawn.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What every rank imports anyway: the fork server imports it once, and each rank forks from it
# (about 0.5 s per pair of ranks instead of 4-6 s for two fresh interpreters importing torch).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torchvision",
    "shardstream",
    "shardstream.shardwriter",
    "shardstream.streaming",
]


def spawn_ranks(
    fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, join: bool = True
) -> Any:
    """``torch.multiprocessing.spawn`` through a fork server that imported torch and shardstream.

    Each rank is still a new process with nothing of the test's own state (the server is a clean
    interpreter started once per test process; it never touched torch.distributed, CUDA or a
    thread), so ranks behave as spawned ones; they run in the caller's environment and working
    folder of the moment, as spawned ones would, and fork their DataLoader workers, as ranks
    started by torchrun do.
    """
    import torch.multiprocessing as mp

    mp.set_forkserver_preload(_PRELOAD)
    return mp.start_processes(
        _in_callers_env, args=(fn, dict(os.environ), os.getcwd(), args), nprocs=nprocs,
        join=join, start_method="forkserver",
    )  # fmt: skip


def _in_callers_env(
    rank: int, fn: Callable[..., None], env: dict[str, str], cwd: str, args: tuple[Any, ...]
) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # A process started by a fork server (or spawned) starts its own children the same way, so
    # each DataLoader worker of a rank would import torch afresh (3 s of CPU per worker here).
    # Ranks that torchrun starts fork their workers; so do these.
    multiprocessing.set_start_method("fork", force=True)
    fn(rank, *args)
