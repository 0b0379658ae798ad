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
    └── StorageError(OSError)             storage kept failing after every retry (names the object)
"""

from __future__ import annotations

__all__ = [
    "ChecksumMismatchError",
    "ConfigError",
    "DatasetExistsError",
    "DecodeError",
    "DuplicateKeyError",
    "ManifestError",
    "ManifestNotFoundError",
    "ShardFormatError",
    "ShardstreamError",
    "SourceError",
    "StorageError",
]


class ShardstreamError(Exception):
    """Base class of every error shardstream raises on purpose."""


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


class StorageError(ShardstreamError, OSError):
    """Reading or writing storage failed after every retry."""
