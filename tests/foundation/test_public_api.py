"""The public surface: every exported name resolves, and the writer never needs torch."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re
import subprocess
import sys

import shardstream


def test_every_exported_name_resolves() -> None:
    assert shardstream.__all__ == sorted(shardstream.__all__)
    for name in shardstream.__all__:
        assert getattr(shardstream, name) is not None, name


def test_importing_the_package_and_the_writer_does_not_import_torch() -> None:
    code = (
        "import sys, shardstream, shardstream.shardwriter, shardstream._cli\n"
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
        if "_storage" in path.relative_to(package).parts:
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

    folder = pathlib.Path(shardstream.__file__).parent / "_storage"
    edges: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "shardstream._st"
            ):
                module = (node.module or "").rsplit(".", 1)[-1]
                targets |= {module} if module != "_storage" else {a.name for a in node.names}
        edges[path.stem] = targets & {p.stem for p in folder.glob("*.py")} - {"__init__"}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start]
        )

    assert [module for module in edges if reaches(module, module, set())] == []


_STORAGE_LIBS = {"fsspec", "s3fs", "botocore", "aiobotocore", "boto3"}


SNAPSHOT = pathlib.Path(__file__).with_name("public_api.txt")


def describe_public_api() -> str:
    """Every public name with its signature; a class also with its public members'.

    The text is compared with ``public_api.txt``: an API change shows there as a diff. To accept a
    deliberate change (with its CHANGELOG line): ``python -m tests.foundation.test_public_api``.
    """
    lines = []
    for name in shardstream.__all__:
        value = getattr(shardstream, name)
        if name == "__version__":
            continue
        if not inspect.isclass(value):
            lines.append(f"{name}{_signature(value)}")
            continue
        lines.append(f"class {name}{_signature(value)}")
        for member, attribute in sorted(vars(value).items()):
            if member.startswith("_") or issubclass(value, BaseException):
                continue
            if isinstance(attribute, property):
                lines.append(f"    {name}.{member}: property")
            elif isinstance(attribute, (staticmethod, classmethod)) or inspect.isfunction(
                attribute
            ):
                lines.append(f"    {name}.{member}{_signature(getattr(value, member))}")
            elif dataclasses.is_dataclass(value) and member in {
                field.name for field in dataclasses.fields(value)
            }:
                continue  # a dataclass field's default: the signature above shows it
            else:
                lines.append(f"    {name}.{member}: {type(attribute).__name__}")
    return "\n".join(lines) + "\n"


def _signature(value: object) -> str:
    try:
        return str(inspect.signature(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"


def test_the_public_api_matches_its_snapshot() -> None:
    assert describe_public_api() == SNAPSHOT.read_text(), (
        "the public API changed: if that is deliberate, run "
        "`python -m tests.foundation.test_public_api` and add a CHANGELOG line"
    )


def test_dir_lists_every_public_name() -> None:
    assert set(shardstream.__all__) <= set(dir(shardstream))


def test_every_public_name_is_in_the_api_reference() -> None:
    docs = pathlib.Path(__file__).parents[2] / "docs" / "api"
    documented = {
        line.removeprefix("::: shardstream.").strip()
        for page in docs.glob("*.md")
        for line in page.read_text().splitlines()
        if line.startswith("::: shardstream.")
    }
    assert set(shardstream.__all__) - {"__version__"} == documented


if __name__ == "__main__":
    SNAPSHOT.write_text(describe_public_api())
    print(f"wrote {SNAPSHOT}")


def test_the_public_docstrings_name_public_paths_only() -> None:
    """What the API reference renders (the public names' docstrings, their members' included)
    sends no reader to an internal module."""
    internal = re.compile(r"shardstream\.(?:catalog|cli|format|shardwriter|storage|streaming)\.")
    found = []
    for name in shardstream.__all__:
        value = getattr(shardstream, name)
        members = vars(value).values() if inspect.isclass(value) else ()
        for item in (value, *members):
            doc = getattr(item, "__doc__", None) if not isinstance(item, str) else None
            if isinstance(doc, str) and internal.search(doc):
                found.append(f"{name}: {internal.search(doc).group(0)}")  # type: ignore[union-attr]
    assert found == []
