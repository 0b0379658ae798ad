"""The public surface: every exported name resolves, and the writer never needs torch."""

from __future__ import annotations

import subprocess
import sys

import shardstream


def test_every_exported_name_resolves() -> None:
    assert shardstream.__all__ == sorted(shardstream.__all__)
    for name in shardstream.__all__:
        assert getattr(shardstream, name) is not None, name


def test_importing_the_package_and_the_writer_does_not_import_torch() -> None:
    code = (
        "import sys, shardstream, shardstream.shardwriter, shardstream.cli\n"
        "from shardstream import build_shards, ReadOptions, Manifest\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_errors_are_also_builtin_exceptions() -> None:
    assert issubclass(shardstream.ManifestNotFoundError, FileNotFoundError)
    assert issubclass(shardstream.StorageError, OSError)
    assert issubclass(shardstream.SourceError, ValueError)
    assert issubclass(shardstream.DatasetExistsError, FileExistsError)
