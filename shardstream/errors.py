"""The exceptions shardstream raises.

Every exception derives from :class:`ShardstreamError` and also from the built-in that fits,
so ``except ValueError`` or ``except OSError`` in existing code keeps working::

    ShardstreamError
    ├── ConfigError(ValueError)           an argument or option is invalid
    ├── SourceError(ValueError)           an input file or sample is unusable (names file and key)
    │   └── DuplicateKeyError             two samples share a key
    ├── DatasetExistsError(FileExistsError)
    │                                     DEST already holds another dataset or another build
    ├── ManifestError(ValueError)         the manifest is unreadable or of an unknown version
    │   └── ManifestNotFoundError(FileNotFoundError)
    │                                     a dataset folder has no manifest (incomplete build?)
    ├── ShardFormatError(ValueError)      a shard is not a valid tar, or is truncated (names shard,
    │   │                                 key and byte offset)
    │   └── ChecksumMismatchError         a shard's bytes or counts differ from the manifest
    ├── DecodeError(ValueError)           a member could not be decoded (names shard and key)
    ├── ResumeError(RuntimeError)         a restored loader is not where the trainer is (names
    │                                     both positions)
    └── StorageError(OSError)             storage kept failing after every retry (names the object)
        └── ShardNotFoundError(FileNotFoundError)
                                          a shard the source names does not exist

An error raised in a DataLoader worker reaches the training process through torch, which
builds the same class again from the worker's whole traceback; these classes keep only the
message (with the worker named) and put the traceback in ``worker_traceback``, so the training
process, and the command line, show one readable line rather than a worker's stack.
"""

from __future__ import annotations

import re

__all__ = [
    "ChecksumMismatchError",
    "ConfigError",
    "DatasetExistsError",
    "DecodeError",
    "DuplicateKeyError",
    "ManifestError",
    "ManifestNotFoundError",
    "ResumeError",
    "ShardFormatError",
    "ShardNotFoundError",
    "ShardstreamError",
    "SourceError",
    "StorageError",
]


#: How torch's ``ExceptionWrapper.reraise`` words an error from a worker.
_WORKER_TEXT = re.compile(
    r"Caught (?P<kind>\w+) (?P<where>in DataLoader worker process \d+)\.\n"
    r"Original (?P<trace>Traceback \(most recent call last\):\n.*)",
    re.DOTALL,
)


class ShardstreamError(Exception):
    """Base class of every error shardstream raises on purpose.

    Attributes:
        worker_traceback: The DataLoader worker's traceback when torch re-raised this error
            in the training process, else None.
    """

    worker_traceback: str | None = None

    def __init__(self, *args: object) -> None:
        trace = None
        if len(args) == 1 and isinstance(args[0], str):
            text, trace = _without_worker_traceback(args[0], type(self))
            args = (text,)
        super().__init__(*args)
        self.worker_traceback = trace


def _without_worker_traceback(text: str, kind: type[BaseException]) -> tuple[str, str | None]:
    """``(message, traceback)`` of torch's re-raise text; ``(text, None)`` for any other."""
    match = _WORKER_TEXT.match(text)
    if match is None or match["kind"] != kind.__name__:
        return text, None
    trace = match["trace"]
    # traceback.format_exception ends with "module.Kind: message" (and any notes after it).
    header = f"\n{kind.__module__}.{kind.__qualname__}: "
    start = trace.rfind(header)
    if start < 0:
        return text, None
    return f"{trace[start + len(header) :].rstrip()} (raised {match['where']})", trace


class ConfigError(ShardstreamError, ValueError):
    """An argument or command-line option is invalid."""


class SourceError(ShardstreamError, ValueError):
    """An input file or sample cannot be used: unreadable, corrupt, badly keyed or labelled."""


class DuplicateKeyError(SourceError):
    """Two samples of one source share a key, so one would shadow the other in a shard."""


class DatasetExistsError(ShardstreamError, FileExistsError):
    """The destination already holds a dataset or an unfinished build with other settings."""


class ManifestError(ShardstreamError, ValueError):
    """A manifest is unreadable, malformed, or of a format version this release cannot read."""


class ManifestNotFoundError(ManifestError, FileNotFoundError):
    """A dataset location has no manifest: the build never finished, or the path is wrong."""


class ShardFormatError(ShardstreamError, ValueError):
    """A shard is not a valid (optionally gzipped) tar archive, or it ends early."""


class ChecksumMismatchError(ShardFormatError):
    """A shard's sha256, byte size or sample count differs from what the manifest records."""


class DecodeError(ShardstreamError, ValueError):
    """A sample member could not be decoded with the requested decoder."""


class ResumeError(ShardstreamError, RuntimeError):
    """A restored loader's position disagrees with the trainer's: its state was not restored,
    or was restored from another checkpoint."""


class StorageError(ShardstreamError, OSError):
    """Reading or writing storage failed after every retry."""


class ShardNotFoundError(StorageError, FileNotFoundError):
    """A shard that the source (a pattern, a list, a manifest) names does not exist."""
