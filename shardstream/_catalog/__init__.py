"""What a dataset is made of: shard lists from any source, indexes, views, merges, versions.

- ``shardlist.py``: :func:`resolve_source`, the one function that turns a source (a dataset
  folder, a manifest file, a brace pattern, a ``.txt`` file of URLs, a list of URLs) into a
  :class:`ShardList`; every entry point (index, the datasets, mixtures) reads sources with it,
  and :func:`read_dataset`, its half for sources with a manifest (views, ``inspect``,
  ``verify``); also what the default epoch order depends on (:class:`DatasetFacts`) and the
  check of shard sizes a dataset makes when it is opened;
- ``indexer.py``: :func:`index_shards`, manifests for other tools' shards (and again, for the
  new ones only, after the folder gained shards);
- ``views.py``: :func:`make_view` and :func:`split_dataset`, subsets by key without copies, and
  views by a predicate over attached fields;
- ``execute.py``: runs index and build tasks on processes or any executor, and
  :func:`merge_partitions`, one manifest over partitions built elsewhere;
- ``versions.py``: versioned manifests of a dataset that grows, the shard files only pruned
  versions list, and the records of the views that read a dataset;
- ``exclude.py``: :func:`exclude_samples`, a version that leaves samples out, in place, and
  where named samples are (their shards and positions);
- ``dups.py``: :func:`find_duplicates`, equal content within and across datasets, from the
  indexes' digests;
- ``attach.py``: :func:`attach_columns`, fields by key from Parquet, CSV or JSONL tables.

The catalog imports storage and format only; the writer and the streaming side import it.
Names are imported lazily, so importing one module imports nothing else.

Examples:
    >>> from shardstream._catalog import resolve_source
    >>> store, shards, manifest = resolve_source("shards/train")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream._catalog.attach import attach_columns
    from shardstream._catalog.dups import find_duplicates
    from shardstream._catalog.exclude import exclude_samples
    from shardstream._catalog.execute import merge_partitions
    from shardstream._catalog.indexer import IndexOptions, index_shards
    from shardstream._catalog.shardlist import (
        DatasetFacts,
        ShardList,
        ShardSource,
        ShardSpec,
        Source,
        read_dataset,
        resolve_source,
    )
    from shardstream._catalog.views import make_view, split_dataset

__all__ = [
    "DatasetFacts",
    "IndexOptions",
    "ShardList",
    "ShardSource",
    "ShardSpec",
    "Source",
    "attach_columns",
    "exclude_samples",
    "find_duplicates",
    "index_shards",
    "make_view",
    "merge_partitions",
    "read_dataset",
    "resolve_source",
    "split_dataset",
]

_LAZY = {
    "attach_columns": "shardstream._catalog.attach",
    "exclude_samples": "shardstream._catalog.exclude",
    "find_duplicates": "shardstream._catalog.dups",
    "DatasetFacts": "shardstream._catalog.shardlist",
    "IndexOptions": "shardstream._catalog.indexer",
    "ShardList": "shardstream._catalog.shardlist",
    "ShardSource": "shardstream._catalog.shardlist",
    "ShardSpec": "shardstream._catalog.shardlist",
    "Source": "shardstream._catalog.shardlist",
    "index_shards": "shardstream._catalog.indexer",
    "make_view": "shardstream._catalog.views",
    "merge_partitions": "shardstream._catalog.execute",
    "read_dataset": "shardstream._catalog.shardlist",
    "resolve_source": "shardstream._catalog.shardlist",
    "split_dataset": "shardstream._catalog.views",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream._catalog' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
