"""Every source form at every entry point: one ``resolve_source`` behind all of them.

The forms: a dataset folder, its ``manifest.json``, a brace pattern, a glob, a Python list of
shard URLs, a ``.txt`` file of URLs (with a comment and a blank line) and one of entries
relative to its own folder, each on local disk and on ``memory://``. The entry points:
``resolve_source`` itself, ``StreamingDataset``, ``RandomAccessDataset``, ``index_shards``
(and ``shardstream index``), ``make_view`` and ``shardstream inspect`` / ``verify``. Forms
without a manifest cannot give what needs one (positions, views, a manifest to inspect): those
are refused with the fix.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from shardstream._catalog import index_shards, make_view, resolve_source
from shardstream._cli import main
from shardstream.errors import ConfigError, ShardNotFoundError
from shardstream.shardwriter import build_shards
from shardstream.streaming import (
    RandomAccessDataset,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
)
from tests.streaming.shards import make_samples

NUM, PER_SHARD = 12, 4
NAMES = [f"shard-{number:06d}.tar" for number in range(NUM // PER_SHARD)]
KEYS = [sample["__key__"] for sample in make_samples(NUM)]
WITH_MANIFEST = ("folder", "manifest")
FORMS = (*WITH_MANIFEST, "pattern", "glob", "list", "txt", "relative-txt")


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """A built dataset of 3 shards (4 samples each), on local disk or on ``memory://``."""
    if request.param == "local":
        url = str(tmp_path / "data")
    else:
        url = f"memory://sources-{uuid.uuid4().hex[:8]}/data"
    build_shards(make_samples(NUM), url, max_samples_per_shard=PER_SHARD)
    yield url
    if request.param == "memory":
        fsspec.filesystem("memory").rm(url.removeprefix("memory://").split("/")[0], recursive=True)


def _source(form: str, root: str) -> Any:
    urls = [f"{root}/{name}" for name in NAMES]
    if form == "folder":
        return root
    if form == "manifest":
        return f"{root}/manifest.json"
    if form == "pattern":
        return f"{root}/shard-{{000000..{len(NAMES) - 1:06d}}}.tar"
    if form == "glob":
        return f"{root}/shard-*.tar"
    if form == "list":
        return urls
    if form == "relative-txt":  # entries relative to the list's folder, not the working one
        listing = f"{root}/lists/relative.txt"
        with fsspec.open(listing, "w", auto_mkdir=True) as stream:
            stream.write("\n".join(f"../{name}" for name in NAMES) + "\n")
        return listing
    listing = f"{root}/shards.txt"
    with fsspec.open(listing, "w") as stream:
        stream.write("# the shards, one a line\n\n" + "\n".join(f"  {url}" for url in urls) + "\n")
    return listing


def _dataset(source: Any) -> StreamingDataset:
    options = StreamOptions(output="dict")
    return StreamingDataset(source, decode="raw", batch_size=1, options=options)


def _keys(dataset: StreamingDataset) -> list[str]:
    loader = StreamingDataLoader(dataset, num_workers=0)
    return sorted(key for batch in loader for key in batch["__key__"])


@pytest.mark.parametrize("form", FORMS)
def test_resolve_source_names_the_shards(form: str, root: str) -> None:
    store, shards, manifest = resolve_source(_source(form, root))
    assert shards.names() == NAMES
    assert [shards.spec(number).name for number in range(len(shards))] == NAMES
    assert store.shown().rstrip("/").endswith("/data")  # the dataset's folder
    assert (manifest is not None) == (form in WITH_MANIFEST)
    assert shards.counted == (form in WITH_MANIFEST)


@pytest.mark.parametrize("form", FORMS)
def test_streaming_dataset_reads_every_sample(form: str, root: str) -> None:
    assert _keys(_dataset(_source(form, root))) == KEYS


@pytest.mark.parametrize("form", FORMS)
def test_random_access_needs_a_manifest(form: str, root: str) -> None:
    source = _source(form, root)
    if form not in WITH_MANIFEST:
        with pytest.raises(ConfigError, match="has no manifest"):
            RandomAccessDataset(source, decode="raw")
        return
    dataset = RandomAccessDataset(source, decode="raw", options=StreamOptions(output="dict"))
    assert len(dataset) == NUM and dataset[5]["__key__"] == KEYS[5]


@pytest.mark.parametrize("form", FORMS)
def test_index_shards_reads_every_form(form: str, root: str) -> None:
    dest = f"{root}-index"
    manifest = index_shards(_source(form, root), dest)
    assert manifest.num_samples == NUM and list(manifest.shards.names) == NAMES
    assert _keys(_dataset(dest)) == KEYS


@pytest.mark.parametrize("form", [form for form in FORMS if form != "list"])
def test_cli_index_reads_every_form(
    form: str, root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = f"{root}-cli-index"
    assert main(["index", _source(form, root), dest, "--quiet"]) == 0
    assert f"indexed {len(NAMES)} shards, {NUM} samples" in capsys.readouterr().out


@pytest.mark.parametrize("form", FORMS)
def test_make_view_needs_a_manifest(form: str, root: str) -> None:
    source = _source(form, root)
    if form not in WITH_MANIFEST:
        with pytest.raises(ConfigError, match="names shards without a manifest"):
            make_view(source, f"{root}-view", fraction=0.5)
        return
    view = make_view(source, f"{root}-view", fraction=0.5)
    keys = _keys(_dataset(f"{root}-view"))
    assert 0 < view.num_samples < NUM and len(keys) == view.num_samples
    assert set(keys) <= set(KEYS)


@pytest.mark.parametrize("command", ["inspect", "verify"])
@pytest.mark.parametrize("form", [form for form in FORMS if form != "list"])
def test_cli_inspect_and_verify_read_a_dataset_or_say_to_index(
    form: str, command: str, root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, _source(form, root)])
    captured = capsys.readouterr()
    if form not in WITH_MANIFEST:
        assert code == 1 and "names shards without a manifest" in captured.err
        return
    assert code == 0
    expected = f"samples:  {NUM}" if command == "inspect" else f"OK, {len(NAMES)} shards"
    assert expected in captured.out


def test_a_missing_local_shard_is_refused_when_the_dataset_is_made(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "data"
    build_shards(make_samples(NUM), root, max_samples_per_shard=PER_SHARD)
    with pytest.raises(ShardNotFoundError, match=r"1 of the 4 shards that .*shard-000003\.tar"):
        StreamingDataset(f"{root}/shard-{{000000..000003}}.tar")
    # Many names in one folder: listed once, not checked name by name.
    with pytest.raises(ShardNotFoundError, match=r"97 of the 100 shards .* such as .*000003"):
        resolve_source(f"{root}/shard-{{000000..000099}}.tar")
    listing = tmp_path / "lists" / "train.txt"
    listing.parent.mkdir()
    listing.write_text("../data/shard-000000.tar\n../data/shard-000009.tar\n")
    with pytest.raises(ShardNotFoundError, match=r"'.*/data/shard-000009\.tar'"):
        StreamingDataset(listing)
    with pytest.raises(ConfigError, match=r"the shard list does not exist"):
        StreamingDataset(tmp_path / "lists" / "other.txt")


def test_a_glob_is_expanded_sorted_and_one_that_matches_nothing_shows_the_brace_form(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "data"
    build_shards(make_samples(NUM), root, max_samples_per_shard=PER_SHARD)
    (root / "notes.txt").write_text("not a shard")
    _, shards, _ = resolve_source(f"{root}/*")  # the folder's other files are not shards
    assert shards.names() == NAMES
    with pytest.raises(ConfigError, match=r"matches no .tar.*brace pattern such as"):
        StreamingDataset(f"{root}/train-*.tar")


def test_a_manifest_copied_from_another_dataset_is_refused_at_open(
    tmp_path: pathlib.Path,
) -> None:
    from shardstream.errors import ManifestError

    build_shards(make_samples(30), tmp_path / "a", max_samples_per_shard=10)
    build_shards(make_samples(24), tmp_path / "b", max_samples_per_shard=8)
    (tmp_path / "b" / "manifest.json").write_bytes((tmp_path / "a" / "manifest.json").read_bytes())
    with pytest.raises(ManifestError, match=r"describes other shards than these: 3 of 3 checked "
                       r"differ in size, such as .*shard-000000\.tar \(\d+ bytes, the manifest "
                       r"says \d+\); was it copied from another dataset"):  # fmt: skip
        StreamingDataset(tmp_path / "b", decode="raw")
    # One of more shards: the last one checked is missing, the others differ.
    build_shards(make_samples(60), tmp_path / "c", max_samples_per_shard=12)  # 5 shards
    (tmp_path / "b" / "manifest.json").write_bytes((tmp_path / "c" / "manifest.json").read_bytes())
    with pytest.raises(ManifestError, match=r"2 of 3 checked differ in size and 1 missing, such "
                       r"as .*shard-000000\.tar .*was it copied from another dataset"):  # fmt: skip
        StreamingDataset(tmp_path / "b", decode="raw")
    one = tmp_path / "a" / "shard-000001.tar"  # one truncated shard is the reader's to report
    one.write_bytes(one.read_bytes()[:5000])
    skipping = StreamingDataset(tmp_path / "a", decode="raw", on_error="skip")
    assert 20 <= sum(sample is not None for sample in skipping) < 30
