"""Fields attached to samples by key, without touching a shard: per-shard Parquet sidecars.

``shardstream attach`` writes, for each shard, one Parquet file of the attached fields with one
row per sample the shard file stores, in its order (``columns/v000004/shard-000012.parquet``,
the version that wrote them in the folder name); a sample that the table did not name has
nulls. The manifest's ``columns`` entry names the folder, the fields and their types, and how
many of the version's shards it covers (shards appended later have no file: their fields are
null). Readers add the fields to each sample as members, so they arrive in samples and batches
like ``json`` or ``cls``. Reading or writing them needs ``pyarrow`` (``shardstream[columns]``).

Predicates over attached fields: ``"aesthetic >= 5 and not nsfw"``, evaluated per shard.

A predicate is a Python expression of field names, constants, comparisons (``<``, ``<=``,
``>``, ``>=``, ``==``, ``!=``, ``in``, ``not in`` a list), ``and``, ``or``, ``not`` and
parentheses; nothing else parses (no calls, no attributes), so a predicate from a command line
runs no code. It is evaluated over a shard's Arrow table of fields with ``pyarrow.compute``; a
null value never satisfies a comparison (``score is None`` selects them; ``== None`` is
refused, as it would select nothing)."""

from __future__ import annotations

import ast
import dataclasses
import io
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shardstream._storage import Store
from shardstream.errors import ConfigError, ManifestError

__all__ = [
    "ColumnSet",
    "Predicate",
    "column_file",
    "columns_folder",
    "import_arrow",
    "read_column_table",
    "read_columns",
    "write_columns",
]


def import_arrow() -> Any:
    """``pyarrow`` (with ``parquet`` and ``compute`` loaded), or a ConfigError saying how to
    install it."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as error:
        raise ConfigError(
            "attached columns are Parquet files: install pyarrow (pip install "
            "'shardstream[columns]')"
        ) from error
    return pyarrow


def columns_folder(version: int) -> str:
    """``columns/v000004``: where version 4's attach writes its files."""
    return f"columns/v{version:06d}"


def column_file(folder: str, shard_name: str) -> str:
    """The Parquet file of a shard's fields (its name without ``.tar``/``.tar.gz``/``.tgz``)."""
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if shard_name.endswith(suffix):
            shard_name = shard_name[: -len(suffix)]
            break
    return f"{folder}/{shard_name}.parquet"


@dataclasses.dataclass(frozen=True)
class ColumnSet:
    """The manifest's ``columns`` entry: where the files are and what they hold.

    Attributes:
        folder: The folder of the files, relative to ``root`` (or to the dataset).
        fields: Field name -> Arrow type (as text), in order.
        num_shards: The version's first shards that have a file (later ones: null fields).
        root: The dataset folder the files are in, when not the manifest's own (a view).
    """

    folder: str
    fields: Mapping[str, str]
    num_shards: int
    root: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the manifest."""
        entry = {"folder": self.folder, "fields": dict(self.fields), "num_shards": self.num_shards}
        return entry if self.root is None else {**entry, "root": self.root}

    @classmethod
    def from_dict(cls, entry: Any, where: str) -> ColumnSet:
        """The entry as read from a manifest; ``where`` names it in errors."""
        try:
            fields = entry["fields"]
            if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
                raise TypeError("fields must map names to types")
            return cls(str(entry["folder"]), dict(fields), int(entry["num_shards"]),
                       entry.get("root"))  # fmt: skip
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestError(f"{where}: malformed columns entry ({error})") from error


def read_column_table(store: Store, name: str) -> Any:
    """A shard's fields as an Arrow table (one row per stored sample).

    Raises:
        ManifestError: The file is not readable Parquet (corrupt or truncated).
    """
    arrow = import_arrow()
    data = store.read_bytes(name)
    try:
        return arrow.parquet.read_table(io.BytesIO(data))
    except (arrow.ArrowInvalid, OSError) as error:
        raise ManifestError(
            f"{store.shown(name)}: the attached fields' file is not readable Parquet ({error}); "
            "attach the table again to rewrite it"
        ) from None


def read_columns(store: Store, name: str) -> dict[str, list[Any]]:
    """A shard's fields as lists (one value per stored sample)."""
    table = read_column_table(store, name)
    return {field: table.column(field).to_pylist() for field in table.column_names}


def write_columns(store: Store, name: str, table: Any) -> None:
    """Write a shard's fields (an Arrow table) atomically; the same table gives the same bytes."""
    arrow = import_arrow()
    buffer = io.BytesIO()
    arrow.parquet.write_table(table, buffer)
    with store.open_atomic_write(name) as stream:
        stream.write(buffer.getvalue())


_COMPARE = {
    ast.Lt: "less", ast.LtE: "less_equal", ast.Gt: "greater", ast.GtE: "greater_equal",
    ast.Eq: "equal", ast.NotEq: "not_equal",
}  # fmt: skip
_KINDS = {str: "string", int: "number", float: "number", bool: "boolean"}
_NOT_CONSTANT = object()


def _constant(node: ast.AST) -> Any:
    """A predicate's constant (a number, possibly signed, text, True/False, None), else
    ``_NOT_CONSTANT`` (bytes and other literals are not constants here)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _constant(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
        return _NOT_CONSTANT
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in _KINDS):
        return node.value
    return _NOT_CONSTANT


class Predicate:
    """A parsed predicate over fields.

    Args:
        text: The expression, e.g. ``"aesthetic >= 5 and label in [1, 2]"``.

    Examples:
        >>> Predicate("aesthetic >= 5 and not nsfw").fields
        ['aesthetic', 'nsfw']
    """

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self._tree = ast.parse(text, mode="eval").body
        except SyntaxError as error:
            raise ConfigError(f"where {text!r}: not an expression ({error.msg})") from None
        self.fields = sorted(set(self._names(self._tree)))

    def _names(self, node: ast.AST) -> Iterable[str]:
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                yield from self._names(value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield from self._names(node.operand)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            self._check_compare(node)
            yield from self._names(node.left)
            if not isinstance(node.comparators[0], (ast.List, ast.Tuple)):
                yield from self._names(node.comparators[0])
        elif _constant(node) is _NOT_CONSTANT:
            raise ConfigError(
                f"where {self.text!r}: {ast.unparse(node)!r} is not allowed; use field names, "
                "constants (numbers, 'text', True, False), comparisons (one operator each), "
                "in [...], is None, and, or, not"
            )

    def _check_compare(self, node: ast.Compare) -> None:
        """Refuse comparisons that would fail inside pyarrow or never be true: ``in`` a
        non-list, ``is`` anything but None, ``== None``."""
        operator, right = node.ops[0], node.comparators[0]
        if isinstance(operator, (ast.In, ast.NotIn)):
            elements = right.elts if isinstance(right, (ast.List, ast.Tuple)) else None
            if elements is None or any(_constant(e) is _NOT_CONSTANT for e in elements):
                raise ConfigError(
                    f"where {self.text!r}: 'in' takes a list of constants, e.g. "
                    f"'{ast.unparse(node.left)} in [1, 2]' or \"caption in ['a', 'b']\", not "
                    f"{ast.unparse(right)}"
                )
        elif isinstance(operator, (ast.Is, ast.IsNot)):
            if not (isinstance(right, ast.Constant) and right.value is None):
                raise ConfigError(
                    f"where {self.text!r}: 'is' and 'is not' take None only (e.g. 'score is "
                    f"None'); compare values with ==, e.g. '{ast.unparse(node.left)} == "
                    f"{ast.unparse(right)}'"
                )
        elif None in (_constant(node.left), _constant(right)):
            name = ast.unparse(node.left if isinstance(right, ast.Constant) else right)
            negated = "not " if isinstance(operator, ast.NotEq) else ""
            raise ConfigError(
                f"where {self.text!r}: a comparison with None is never true (a missing value "
                f"equals nothing); write '{name} is {negated}None'"
            )

    def mask(self, table: Any) -> np.ndarray:
        """Which rows of an Arrow table of fields satisfy the predicate (a boolean array).

        Raises:
            ConfigError: The predicate names a field the table does not have.
        """
        missing = [name for name in self.fields if name not in table.column_names]
        if missing:
            raise ConfigError(
                f"where {self.text!r}: no field {missing[0]!r} (attached fields: "
                f"{', '.join(table.column_names) or 'none'})"
            )
        arrow = import_arrow()
        value = self._truth(self._tree, table, arrow)
        if isinstance(value, arrow.Scalar) or not hasattr(value, "type"):
            value = arrow.array(
                [value.as_py() if hasattr(value, "as_py") else value] * len(table), arrow.bool_()
            )
        elif arrow.types.is_null(value.type):  # a field attached with no value in any row
            value = value.cast(arrow.bool_())
        return np.asarray(arrow.compute.fill_null(value, False).to_numpy(zero_copy_only=False))

    def _truth(self, node: ast.AST, table: Any, arrow: Any) -> Any:
        """``node``'s value, refused unless it is true/false (a bare number field is not)."""
        value = self._evaluate(node, table, arrow)
        kind = getattr(value, "type", None)
        example = node.id if isinstance(node, ast.Name) else "score"
        if (
            kind is not None
            and not arrow.types.is_boolean(kind)
            and (isinstance(node, ast.Constant) or not arrow.types.is_null(kind))
        ):
            raise ConfigError(
                f"where {self.text!r}: {self._describe(node, value)} is not true/false; compare "
                f"a field with a value, e.g. '{example} > 0' (or name a boolean field)"
            )
        return value

    def _describe(self, node: ast.AST, value: Any) -> str:
        """``field 'aesthetic' (int64)`` or ``the constant '5' (a string)``."""
        if isinstance(node, ast.Name):
            return f"field {node.id!r} ({value.type})"
        if _constant(node) is not _NOT_CONSTANT:
            value = _constant(node)
            return f"the constant {value!r} (a {_KINDS.get(type(value), 'value')})"
        return repr(ast.unparse(node))

    def _evaluate(self, node: ast.AST, table: Any, arrow: Any) -> Any:
        compute = arrow.compute
        if isinstance(node, ast.Name):
            return table.column(node.id)
        if _constant(node) is not _NOT_CONSTANT:
            return arrow.scalar(_constant(node))
        if isinstance(node, (ast.List, ast.Tuple)):
            return [_constant(element) for element in node.elts]
        if isinstance(node, ast.BoolOp):
            combine = compute.and_kleene if isinstance(node.op, ast.And) else compute.or_kleene
            result = self._truth(node.values[0], table, arrow)
            for value in node.values[1:]:
                result = combine(result, self._truth(value, table, arrow))
            return result
        if isinstance(node, ast.UnaryOp):
            return compute.invert(self._truth(node.operand, table, arrow))
        if not isinstance(node, ast.Compare):  # never: _names let nothing else through
            raise ConfigError(f"where {self.text!r}: cannot evaluate {ast.unparse(node)!r}")
        left = self._evaluate(node.left, table, arrow)
        right = self._evaluate(node.comparators[0], table, arrow)
        operator = type(node.ops[0])
        if operator in (ast.Is, ast.IsNot):  # `is None`, `is not None` (_check_compare)
            return compute.is_null(left) if operator is ast.Is else compute.is_valid(left)
        try:
            if operator in (ast.In, ast.NotIn):
                found = compute.is_in(left, value_set=arrow.array(right))
                return found if operator is ast.In else compute.invert(found)
            return getattr(compute, _COMPARE[operator])(left, right)
        except (arrow.ArrowInvalid, arrow.ArrowNotImplementedError, arrow.ArrowTypeError):
            raise ConfigError(
                f"where {self.text!r}: cannot compare {self._describe(node.left, left)} with "
                f"{self._operand(node.comparators[0], right)}; compare a field with a value of "
                "its type (a number field with a number: aesthetic > 5, not aesthetic > '5')"
            ) from None

    def _operand(self, node: ast.AST, value: Any) -> str:
        if isinstance(node, (ast.List, ast.Tuple)):
            return f"the list {ast.unparse(node)}"
        return self._describe(node, value)
