"""What `attach` and `view --where` say about tables and predicates they cannot use: one
`error:` line naming the file, the field and the row, and column types decided explicitly."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream import ConfigError, RandomAccessDataset, StreamOptions, build_shards, read_manifest
from shardstream._catalog.attach import attach_columns
from shardstream._cli import main
from tests.streaming.shards import make_samples


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("scored") / "ds"
    build_shards(make_samples(12), root, max_samples_per_shard=5)
    attach_columns(root, pa.table({"__key__": [f"s{i:06d}" for i in range(12)],
                                   "aesthetic": [i % 6 for i in range(12)]}))  # fmt: skip
    return root


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "pyarrow" not in err and "Arrow" not in err, err
    return err


@pytest.mark.parametrize(("where", "said"), [
    ('aesthetic > "5"', "cannot compare field 'aesthetic' (int64) with the constant '5'"),
    ("aesthetic", "field 'aesthetic' (int64) is not true/false"),
    ("not aesthetic", "field 'aesthetic' (int64) is not true/false"),
    ("aesthetic >= 1 and aesthetic", "field 'aesthetic' (int64) is not true/false"),
    ('aesthetic in [1, "a"]', "cannot compare field 'aesthetic' (int64) with the list"),
    ("aesthetic is 1", "'is' and 'is not' take None only"),
    ("aesthetic is not True", "'is' and 'is not' take None only"),
    ("aesthetic == None", "a comparison with None is never true (a missing value equals "
                          "nothing); write 'aesthetic is None'"),
    ("None != aesthetic", "write 'aesthetic is not None'"),
    ('aesthetic in "12"', "'in' takes a list of constants"),
    ("aesthetic in [aesthetic]", "'in' takes a list of constants"),
    ("None", "the constant None (a value) is not true/false"),
    ("aesthetic > 1 or None", "the constant None (a value) is not true/false"),
    ('aesthetic == b"1"', "\"b'1'\" is not allowed"),
])  # fmt: skip
def test_a_predicate_of_the_wrong_type_is_one_line_naming_the_field(
    scored: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
    where: str, said: str,
) -> None:  # fmt: skip
    err = _error(["view", str(scored), str(tmp_path / "v"), "--where", where], capsys)
    assert said in err, err
    assert not (tmp_path / "v").exists()
    assert main(["view", str(scored), str(tmp_path / "ok"), "--where", "aesthetic >= 3", "-q"]) == 0
    assert "6 samples" in capsys.readouterr().out


def test_negative_constants_and_is_none_select_what_they_say(
    scored: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstream._format.columns import Predicate

    table = pa.table({"score": [-2.5, None, 0.0, 3.0], "tag": ["a", None, "b", "a"]})
    assert Predicate("score > -1").mask(table).tolist() == [False, False, True, True]
    assert Predicate("score in [-2.5, 3]").mask(table).tolist() == [True, False, False, True]
    assert Predicate("score is None").mask(table).tolist() == [False, True, False, False]
    assert Predicate("tag is not None and score < +1").mask(table).tolist() == [
        True, False, True, False]  # fmt: skip
    assert main(["view", str(scored), str(tmp_path / "v"), "--where", "aesthetic > -1", "-q"]) == 0
    assert "12 samples" in capsys.readouterr().out


def test_tables_that_do_not_read_are_one_line_naming_the_file_and_row(
    scored: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = tmp_path / "extra.csv"
    extra.write_text("__key__,score\ns000001,3\ns000002,4,9\n")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"__key__": "s000001", "m": 1}\n{"__key__": "s000002", "m": "x"}\n')
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + b"\0" * 64)
    header = tmp_path / "header.csv"
    header.write_text("__key__,score\n")
    twice = tmp_path / "twice.csv"
    twice.write_text("__key__,score,score\ns000001,1,2\n")
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("__key__,score\nimg_1,1\nimg_2,2\n")
    for table, said in [
        (extra, "extra.csv: line 3 has 3 columns where the header has 2"),
        (mixed, "mixed.jsonl: field 'm' is a number in one row and a string at line 2"),
        (corrupt, "corrupt.parquet: not a readable Parquet file"),
        (header, "the table has no rows (a header only?); nothing to attach"),
        (twice, "twice.csv: has two columns named 'score'; rename one"),
        (unknown, "none of the table's 2 keys is a sample's key (its column '__key__' holds "
                  "keys such as 'img_1', the shards keys such as 's000000'); nothing was "
                  "attached. Give the table the samples' keys, or name the column that holds "
                  "them with --key COLUMN"),
    ]:  # fmt: skip
        assert said in _error(["attach", str(scored), str(table)], capsys)
    # The fix it names works: a JSON reader cannot take "--type m=string" for 1 and "x".
    assert "--type" not in _error(["attach", str(scored), str(mixed)], capsys)
    _error(["attach", str(scored), str(mixed), "--type", "m=string"], capsys)
    objects = tmp_path / "objects.jsonl"
    objects.write_text('{"__key__": "s000001", "m": {"a": 1}}\n{"__key__": "s000002", "m": 1}\n')
    said = "objects.jsonl: field 'm' is an object in one row and a number at line 2"
    assert said in _error(["attach", str(scored), str(objects)], capsys)
    assert read_manifest(scored).version == 2  # nothing was published
    assert sorted(path.name for path in (scored / "columns").iterdir()) == ["v000002"]


def test_keys_that_look_like_numbers_match_as_text(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    samples = [{"__key__": f"{i:09d}", "cls": i % 2} for i in range(6)]  # webdataset's keys
    build_shards(samples, root, max_samples_per_shard=3)
    table = tmp_path / "scores.csv"
    table.write_text("__key__,score\n" + "".join(f"{i:09d},{i}\n" for i in range(6)))
    manifest = attach_columns(root, table)
    assert manifest.settings["attach"]["matched_samples"] == 6
    sample = RandomAccessDataset(root, decode="raw", options=StreamOptions(output="dict"))
    assert sample.by_key("000000004")["score"] == 4


def test_a_stray_text_cell_is_refused_not_turned_into_a_text_column(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(6), root, max_samples_per_shard=3)
    table = tmp_path / "scores.csv"
    table.write_text("__key__,score,caption\ns000001,3,a\ns000002,abc,7\ns000003,4.5,c\n")
    err = _error(["attach", str(root), str(table)], capsys)
    assert "column 'score' is numbers in 2 of 3 rows but 'abc' at line 3" in err, err
    assert "--type score=float64" in err and "types=" not in err
    with pytest.raises(ConfigError, match=r"types=\{'score': 'string'\} \(--type score"):
        attach_columns(root, table)  # Python's spelling, then the command line's
    for typo in (table, tmp_path / "a.jsonl"):  # a misspelt name was ignored, or a null field
        (tmp_path / "a.jsonl").write_text('{"__key__": "s000001", "score": 1}\n')
        with pytest.raises(ConfigError, match="declared types name 'socre', which is not a col"):
            attach_columns(root, typo, types={"socre": "float64"})
    with pytest.raises(ConfigError, match="declared double but line 3 holds 'abc'"):
        attach_columns(root, table, types={"score": "float64"})
    assert main(["attach", str(root), str(table), "--type", "score=string", "-q"]) == 0
    assert "score (string), caption (string)" in capsys.readouterr().out  # as declared
    err = _error(["view", str(root), str(tmp_path / "v"), "--where", "score > 1"], capsys)
    assert "cannot compare field 'score' (string) with the constant 1" in err
    good = tmp_path / "good.csv"
    good.write_text("__key__,score\ns000001,3\ns000002,\ns000003,4.5\n")  # an empty cell: null
    attach_columns(root, good)
    sample = RandomAccessDataset(root, decode="raw", options=StreamOptions(output="dict"))
    assert sample.by_key("s000003")["score"] == 4.5 and sample.by_key("s000002")["score"] is None


def test_a_corrupt_fields_file_is_named_when_a_view_reads_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(6), root, max_samples_per_shard=3)
    attach_columns(root, pa.table({"__key__": ["s000001"], "x": [1]}))
    [first, *_] = sorted((root / "columns").rglob("*.parquet"))
    assert pq.read_table(first).num_rows == 3
    first.write_bytes(b"PAR1 not really")
    err = _error(["view", str(root), str(tmp_path / "v"), "--where", "x > 0"], capsys)
    assert f"{first.name}: the attached fields' file is not readable Parquet" in err, err


def test_a_dataframe_column_of_mixed_types_is_refused_naming_the_row(
    scored: pathlib.Path,
) -> None:
    import pandas as pd

    frame = pd.DataFrame({"__key__": ["s000001", "s000002", "s000003"], "m": [1, 2, "x"]})
    with pytest.raises(ConfigError, match=r"column 'm' mixes types \(int in its first rows; "
                       r"row 2 holds 'x'\)"):  # fmt: skip
        attach_columns(scored, frame)
    assert read_manifest(scored).version == 2


def test_a_field_that_is_not_a_python_name_is_named_when_a_predicate_cannot_use_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(6), root, max_samples_per_shard=3)
    keys = [f"s{i:06d}" for i in range(6)]
    attach_columns(root, pa.table({"__key__": keys, "my-score": range(6), "class": range(6)}))
    for where, said in [
        ("my-score > 1", "field 'my-score' is not a Python name, so a predicate cannot name "
                         "it: attach it again under a name such as 'my_score'"),
        ("class > 1", "not an expression (invalid syntax); field 'class' is not a Python name"),
    ]:  # fmt: skip
        assert said in _error(["view", str(root), str(tmp_path / "v"), "--where", where], capsys)


def test_is_none_keeps_the_samples_appended_after_the_attach(tmp_path: pathlib.Path) -> None:
    from shardstream._catalog.views import make_view
    from tests.conftest import encode_image, write_image_folder

    root = tmp_path / "ds"
    build_shards(write_image_folder(tmp_path / "a", per_class=2), root, max_samples_per_shard=3)
    given = {"__key__": ["class_00/img_00000", "class_01/img_00002"], "score": [1.0, None]}
    attach_columns(root, pa.table(given))
    more = tmp_path / "b" / "class_00"
    more.mkdir(parents=True)
    for name in ("class_01", "class_02"):  # the same classes, empty
        (tmp_path / "b" / name).mkdir()
    for i in range(4):
        (more / f"extra_{i}.jpg").write_bytes(encode_image(16, 16, seed=100 + i))
    build_shards(tmp_path / "b", root, max_samples_per_shard=3, append=True)  # fields: null
    missing = make_view(root, tmp_path / "missing", where="score is None")
    assert missing.num_samples == 5 + 4  # 4 rows never given, 1 null, and the 4 appended
    assert make_view(root, tmp_path / "given", where="score is not None").num_samples == 1
