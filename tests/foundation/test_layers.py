"""The layers import one way: errors <- _storage <- _format <- _catalog <- {shardwriter,
streaming} <- _cli (the private packages start with an underscore).

Read from the source with ``ast`` (every import, also those inside functions and those under
``TYPE_CHECKING``: a type-only import is still a dependency, and a circle through one is still
a circle), so a wrong-way import or a cycle fails here before it hides behind a lazy import.
Inside a package, folders import one way too (``FOLDER_ORDER``). No two modules share a file
name (a newcomer who opens ``passes.py`` should find the one meant), and none is over
``MAX_LINES`` lines.
Planning is torch-free and I/O-free, the format package torch-free, and both import in a Python
where torch cannot be imported at all. Pass control (``streaming/_control``) never imports the
dataset or the loader it serves, and only ``_control/context.py`` reads ``torch.distributed`` or
the DataLoader worker.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import shardstream

PACKAGE = pathlib.Path(shardstream.__file__).parent
FACTS = "shardstream._catalog.shardlist"

#: Which top-level parts each part may import (besides itself and errors).
ALLOWED = {
    "errors": set(),
    "_version": set(),
    "_storage": set(),
    "_format": {"_storage"},
    "_catalog": {"_storage", "_format"},
    "shardwriter": {"_storage", "_format", "_catalog"},
    "streaming": {"_storage", "_format", "_catalog"},
    "_cli": {"_storage", "_format", "_catalog", "shardwriter", "streaming"},
    "__init__": {"_storage", "_format", "_catalog", "shardwriter", "streaming"},
    "__main__": {"_cli"},
}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports (a ``from x import y`` may name module y)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_layers_import_one_way() -> None:
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        part = _part(module)
        for target in _imports(path, set(modules)):
            other = _part(target)
            if other not in (part, "errors", "_version", "__init__") and other not in ALLOWED[part]:
                wrong.append(f"{module} -> {target}")
            if other == "__init__" and part != "__init__" and target == "shardstream":
                wrong.append(f"{module} -> shardstream (the package root)")
    assert wrong == []


#: Per package with folders, its folders from the bottom up: a module in one may import its own
#: folder and those before it, never one after. The package's own modules (the dataset, the
#: loader, ``store.py``) wire the folders together and are not in the order.
FOLDER_ORDER = {
    "_storage": ["remote", "backends"],
    "streaming": ["_planning", "_decoding", "_worker", "_control", "_diagnostics"],
}


def _folder(module: str) -> tuple[str, str] | None:
    """``(package, folder)`` of a module inside a package's folder, else None."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[2] in FOLDER_ORDER.get(parts[1], ()):
        return parts[1], parts[2]
    return None


def test_every_folder_has_its_place_in_the_order() -> None:
    folders = {
        (path.parent.parent.name, path.parent.name) for path in PACKAGE.glob("*/*/__init__.py")
    }
    placed = {(package, folder) for package, order in FOLDER_ORDER.items() for folder in order}
    assert folders == placed


def test_no_import_runs_upwards_inside_a_package() -> None:
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        here = _folder(module)
        if here is None:
            continue
        order = FOLDER_ORDER[here[0]]
        for target in _imports(path, set(modules)):
            there = _folder(target)
            if there and there[0] == here[0] and order.index(there[1]) > order.index(here[1]):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


#: File names more than one module may have: a package's ``options.py`` (its one options module),
#: and the CLI's modules, each named after the command it runs (``cli/build.py`` runs
#: ``shardstream build`` with ``shardwriter/build.py``).
SHARED_NAMES = {"__init__.py", "__main__.py", "options.py"}

#: The longest a module may be: modules hold one concept whole (most land under ~500 lines),
#: split by responsibility, never to meet a count (shared/STYLE.md).
MAX_LINES = 700


def test_no_two_library_modules_share_a_file_name() -> None:
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in SHARED_NAMES or path.parent.name == "_cli":
            continue
        seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _top_level(node: ast.AST) -> set[str]:
    """Top-level package names a module imports at import time (not inside functions)."""
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            names.update(alias.name.split(".")[0] for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module:
            names.add(child.module.split(".")[0])
        elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names |= _top_level(child)
    return names


def test_planning_and_format_need_no_torch_and_planning_no_storage() -> None:
    modules = _modules()
    for module, path in modules.items():
        if module.startswith(("shardstream.streaming._planning", "shardstream._format")):
            assert "torch" not in _top_level(ast.parse(path.read_text())), module
        if module.startswith("shardstream.streaming._planning"):
            every = {
                (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                and (not isinstance(node, ast.ImportFrom) or node.module)
                for alias in node.names
            }
            assert "torch" not in every, module
            targets = _imports(path, set(modules))
            # catalog.facts is plain data (the dataset facts the order formulas take).
            inside = ("shardstream.streaming._planning", "shardstream.errors", FACTS)
            targets -= {"shardstream._catalog"}  # the lazy package __init__ on the way to facts
            assert all(target.startswith(inside) for target in targets), (module, targets)


#: Standard and third-party modules through which code reads files, sockets or processes.
IO_MODULES = {
    "botocore", "fsspec", "io", "mmap", "multiprocessing", "os", "pathlib", "requests", "shutil",
    "socket", "subprocess", "tempfile", "threading", "urllib",
}  # fmt: skip


def test_planning_is_io_free() -> None:
    """Planning holds formulas: no storage, no worker stages (run time), no I/O modules."""
    modules = _modules()
    for module, path in modules.items():
        if not module.startswith("shardstream.streaming._planning"):
            continue
        tree = ast.parse(path.read_text())
        every = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and (not isinstance(node, ast.ImportFrom) or node.module)
            for alias in node.names
        }
        assert not every & IO_MODULES, (module, every & IO_MODULES)
        runtime = ("shardstream._storage", "shardstream.streaming._worker")
        targets = _imports(path, set(modules))
        assert not [target for target in targets if target.startswith(runtime)], module


def test_no_module_imports_itself_in_a_cycle() -> None:
    modules = _modules()
    edges = {module: _imports(path, set(modules)) - {module} for module, path in modules.items()}
    # A package's __init__ is imported on the way to its modules: an edge to it is not a cycle
    # back from its own modules.
    for module in edges:
        edges[module] = {t for t in edges[module] if not module.startswith(t + ".")}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for target in edges.get(node, ()):
                if target == start:
                    return [*path, start]
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
        return None

    cycles = [cycle for module in edges if (cycle := cycle_from(module))]
    assert cycles == []


def test_planning_and_format_import_where_torch_cannot() -> None:
    planning = sorted(m for m in _modules() if m.startswith("shardstream.streaming._planning"))
    formats = sorted(m for m in _modules() if m.startswith("shardstream._format"))
    code = (
        "import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"
        "import importlib\n"
        f"for name in {planning + formats!r}: importlib.import_module(name)\n"
        "import shardstream._format, shardstream.streaming._planning, shardstream.streaming\n"
        "import shardstream._catalog.shardlist\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_pass_control_imports_neither_the_dataset_nor_the_loader() -> None:
    modules = _modules()
    wiring = {"shardstream.streaming._dataset", "shardstream.streaming._loader"}
    control = "shardstream.streaming._control"
    wrong = [
        f"{module} -> {target}"
        for module, path in modules.items()
        if module.startswith(control)
        for target in _imports(path, set(modules)) & wiring
    ]
    assert wrong == []


def test_only_the_context_reads_torch_distributed_and_the_worker_info() -> None:
    readers = ("get_worker_info", "torch.distributed", "is_initialized", "get_rank")
    found = []
    for module, path in _modules().items():
        if module == "shardstream.streaming._control.context":
            continue
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        tree = ast.parse(code)
        names = {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        names |= {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        names |= {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        found += [f"{module}: {name}" for name in names if any(r in name for r in readers)]
    assert found == []
