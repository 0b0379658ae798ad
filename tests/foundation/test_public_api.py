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


def test_only_the_storage_package_imports_fsspec_or_botocore() -> None:
    import ast
    import pathlib

    package = pathlib.Path(shardstream.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if "storage" in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in _STORAGE_LIBS]
    assert offenders == []


def test_storage_modules_form_no_import_cycle() -> None:
    import ast
    import pathlib

    folder = pathlib.Path(shardstream.__file__).parent / "storage"
    edges: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "shardstream.st"
            ):
                module = (node.module or "").rsplit(".", 1)[-1]
                targets |= {module} if module != "storage" else {a.name for a in node.names}
        edges[path.stem] = targets & {p.stem for p in folder.glob("*.py")} - {"__init__"}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start]
        )

    assert [module for module in edges if reaches(module, module, set())] == []


_STORAGE_LIBS = {"fsspec", "s3fs", "botocore", "aiobotocore", "boto3"}
