"""``shardstream bench --shuffle``: the mix report on a class-ordered dataset, real workers."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from shardstream._cli import main
from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamOptions
from shardstream.streaming._diagnostics.mixcheck import (
    MixCheckOptions,
    check_mix,
    random_distinct,
    spearman,
)

CLASSES, PER_CLASS = 40, 100


@pytest.fixture(scope="module")
def ordered(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """40 classes x 100 samples written in class order, one class per shard."""
    dest = tmp_path_factory.mktemp("mix") / "ds"
    samples = (
        {"__key__": f"s{i:05d}", "bin": bytes(32), "cls": i // PER_CLASS, "txt": f"c{i // 1000}"}
        for i in range(CLASSES * PER_CLASS)
    )
    build_shards(samples, dest, max_samples_per_shard=PER_CLASS)
    return dest


def test_default_order_reads_as_mixed_as_a_random_one(ordered: pathlib.Path) -> None:
    summary = check_mix(ordered, MixCheckOptions(workers=2, batch_size=32))
    assert summary["samples"] == CLASSES * PER_CLASS and summary["baseline"] == "every sample"
    assert summary["random_distinct_per_batch"] == pytest.approx(
        random_distinct(np.full(CLASSES, PER_CLASS), 32)
    )
    assert summary["distinct_ratio"] >= 0.9
    assert abs(summary["spearman"]) <= 0.1
    assert summary["advice"] == []


def test_a_poor_order_is_measured_and_advised(ordered: pathlib.Path) -> None:
    poor = StreamOptions(chunk_size=0, num_open=2, piece_size=100)
    summary = check_mix(ordered, MixCheckOptions(workers=2, batch_size=32), stream_options=poor)
    assert summary["distinct_ratio"] < 0.5
    assert any("num_open" in line for line in summary["advice"])


def test_partial_reads_take_the_random_figure_from_drawn_samples(ordered: pathlib.Path) -> None:
    options = MixCheckOptions(workers=0, batch_size=32, batches=10, baseline_samples=500)
    summary = check_mix(ordered, options)
    assert summary["batches"] == 10 and summary["baseline"] == "500 samples drawn at random"
    assert summary["num_classes"] > 30  # the drawn samples cover the dataset's classes


def test_shards_without_a_manifest_get_the_mix_figure_only(ordered: pathlib.Path) -> None:
    pattern = str(ordered / f"shard-{{000000..{CLASSES - 1:06d}}}.tar")
    summary = check_mix(pattern, MixCheckOptions(workers=2, batch_size=32))
    assert summary["spearman"] is None and "no manifest" in summary["baseline"]
    assert summary["samples"] == CLASSES * PER_CLASS


def test_missing_labels_name_the_label_option(
    tmp_path: pathlib.Path, ordered: pathlib.Path
) -> None:
    dest = tmp_path / "unlabelled"
    build_shards(({"__key__": f"k{i}", "bin": bytes(8)} for i in range(20)), dest)
    with pytest.raises(ConfigError, match=r"--label KEY"):
        check_mix(dest, MixCheckOptions(workers=0, batch_size=4))
    by_text = check_mix(ordered, MixCheckOptions(workers=0, batch_size=32, label="txt"))
    assert by_text["num_classes"] == 4  # "c0".."c3": the member given, not .cls
    with pytest.raises(ConfigError, match=r"no member 'caption'.*--label KEY"):
        check_mix(ordered, MixCheckOptions(workers=0, batch_size=32, label="caption"))


def test_bench_shuffle_command_prints_a_table_and_json(
    ordered: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(ordered), "--shuffle", "--batch-size", "32", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "distinct classes per batch" in out and "Spearman" in out
    assert main(["bench", str(ordered), "--shuffle", "--batch-size", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["distinct_ratio"] >= 0.9 and report["batches"] == CLASSES * PER_CLASS // 32


def test_spearman_of_orders() -> None:
    rng = np.random.default_rng(0)
    assert spearman(np.arange(1000)) == 1.0
    assert abs(spearman(rng.permutation(1000))) < 0.1
