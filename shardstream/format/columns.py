"""Fields attached to samples by key, without touching a shard: per-shard Parquet sidecars.

``shardstream attach`` writes, for each shard, one Parquet file of the attached fields with one
row per sample the shard file stores, in its order (``columns/v000004/shard-000012.parquet``,
the version that wrote them in the folder name); a sample that the table did not name has
nulls. The manifest's ``columns`` entry names the folder, the fields and their types, and how
many of the version's shards it covers (shards appended later have no file: their fields are
null). Readers add the fields to each sample as members, so they arrive in samples and batches
like ``json`` or ``cls``. Reading or writing them needs ``pyarrow`` (``shardstream[columns]``).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from typing import Any

from shardstream.errors import ConfigError, ManifestError
from shardstream.storage import Store

__all__ = [
    "ColumnSet",
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
