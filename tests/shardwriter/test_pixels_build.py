"""``build --pixels``: images decoded once and stored as uint8 ``KEY.pixels.npy`` members."""

from __future__ import annotations

import io
import pathlib
import warnings

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from shardstream._cli import main
from shardstream._format.codecs import PixelSize, encode_pixels, pixel_array
from shardstream._format.shardindex import decode_index, index_version
from shardstream.errors import ConfigError, SourceError
from shardstream.shardwriter import BuildOptions, build_shards

from ..conftest import write_image_folder
from .growth import write_day
from .helpers import read_with_webdataset, shard_paths


def _sources(root: pathlib.Path) -> dict[str, bytes]:
    """The source images by sample key (``class_XX/[sub/]img_N`` without the extension)."""
    return {
        str(path.relative_to(root).with_suffix("")): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file()
    }


def _resized(data: bytes, size: tuple[int, int]) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB").resize(size, Image.Resampling.BICUBIC))


@pytest.mark.parametrize(
    ("spec", "source_size", "stored"),
    [
        ("short=20", (40, 30), (20, 27)),
        ("short=60", (30, 40), (80, 60)),
        ("24x16", (40, 30), (16, 24)),
    ],
    ids=["shrink-landscape", "enlarge-portrait", "box"],
)
def test_members_are_npy_pixels_at_the_chosen_size(
    tmp_path: pathlib.Path, spec: str, source_size: tuple[int, int], stored: tuple[int, int]
) -> None:
    root = write_image_folder(tmp_path / "images", num_classes=2, per_class=3, size=source_size)
    manifest = build_shards(root, tmp_path / "ds", pixels=spec, max_samples_per_shard=4)
    assert manifest.num_samples == 6 and manifest.settings["pixels"] == spec
    sources = _sources(root)
    samples = read_with_webdataset(tmp_path / "ds")  # what the webdataset library reads
    assert sorted(sample["__key__"] for sample in samples) == sorted(sources)
    for sample in samples:
        assert set(sample) == {"__key__", "pixels.npy", "cls"}
        pixels = np.load(io.BytesIO(sample["pixels.npy"]), allow_pickle=False)
        assert pixels.dtype == np.uint8 and pixels.shape == (*stored, 3)
        expected = _resized(sources[sample["__key__"]], (stored[1], stored[0]))
        assert np.abs(pixels.astype(int) - expected).mean() < 1.0  # the same image, resized
    for shard in manifest.shards:  # every image's size in the index: no member to read
        data = (tmp_path / "ds" / str(shard.index)).read_bytes()
        shapes = decode_index(data, str(shard.index)).shapes
        assert index_version(data) == 4 and shapes.tolist() == [list(stored)] * shard.num_samples


def test_webdataset_decodes_them_as_arrays(tmp_path: pathlib.Path) -> None:
    root = write_image_folder(tmp_path / "images", num_classes=1, per_class=2, size=(40, 30))
    build_shards(root, tmp_path / "ds", pixels="short=10")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = wds.WebDataset(shard_paths(tmp_path / "ds"), shardshuffle=False).decode()
        arrays = [sample["pixels.npy"] for sample in dataset]
        del dataset
    assert [(a.dtype, a.shape) for a in arrays] == [(np.uint8, (10, 13, 3))] * 2


def test_the_npy_header_is_numpys_and_fixed() -> None:
    for shape in [(1, 1, 3), (256, 341, 3), (4000, 6000, 3)]:
        pixels = np.zeros(shape, np.uint8)
        buffer = io.BytesIO()
        np.save(buffer, pixels, allow_pickle=False)
        assert encode_pixels(pixels) == buffer.getvalue()
        assert pixel_array(encode_pixels(pixels), "k").shape == shape
    with pytest.raises(ValueError, match="uint8"):
        encode_pixels(np.zeros((2, 2, 3), np.float32))


def test_sizes_parse_once_and_bad_ones_say_the_forms() -> None:
    assert BuildOptions(pixels="SHORT=256").pixels == "short=256"
    assert BuildOptions(pixels="box=320x240").pixels == "320x240"
    assert PixelSize.parse(str(BuildOptions(pixels="32x24").pixels)) == PixelSize(box=(32, 24))
    for bad in ["256", "short=0", "0x10", "short=256px"]:
        with pytest.raises(ConfigError, match=r"short=N|>= 1"):
            BuildOptions(pixels=bad)
    with pytest.raises(ConfigError, match="pass pixels alone"):
        BuildOptions(pixels="short=64", resize=64)
    assert "pixels" not in BuildOptions().output_settings()  # manifests of encoded builds as before


def test_iterable_sources_are_refused_with_the_alternative(tmp_path: pathlib.Path) -> None:
    samples = [{"__key__": "a", "jpg": b"x"}]
    with pytest.raises(ConfigError, match=r"'pixels\.npy' member"):
        build_shards(samples, tmp_path / "ds", pixels="short=8")


def test_a_broken_image_names_its_file_or_is_skipped(tmp_path: pathlib.Path) -> None:
    root = write_image_folder(tmp_path / "images", num_classes=1, per_class=3, size=(20, 20))
    broken = sorted(root.rglob("*.jpg"))[0]
    broken.write_bytes(broken.read_bytes()[:200] + b"\xff\xd9")  # a truncated scan, end marker
    with pytest.raises(SourceError, match=f"{broken.name}: cannot decode image"):
        build_shards(root, tmp_path / "ds", pixels="short=8")
    manifest = build_shards(root, tmp_path / "ds2", pixels="short=8", on_error="skip")
    assert manifest.num_samples == 2 and manifest.skipped[0].source == str(broken)


def test_append_takes_pixels_into_a_pixel_dataset_only(tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1), dest, pixels="short=8")
    day2 = write_day(tmp_path / "day2", 2, per_class=1)
    with pytest.raises(SourceError, match="--pixels when it stores pixels"):
        build_shards(day2, dest, append=True)
    manifest = build_shards(day2, dest, append=True, pixels="short=8")
    assert manifest.num_samples == 10
    members = {frozenset(sample) - {"__key__"} for sample in read_with_webdataset(dest)}
    assert members == {frozenset({"pixels.npy", "cls"})}


def test_cli_build_and_inspect_show_pixels_and_bytes_per_sample(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_image_folder(tmp_path / "images", num_classes=2, per_class=2, size=(40, 30))
    dest = str(tmp_path / "ds")
    assert main(["build", "-q", str(root), dest, "--pixels", "32x24"]) == 0
    capsys.readouterr()
    assert main(["inspect", dest]) == 0
    out = capsys.readouterr().out
    # The member: a tar header and 128 + 24*32*3 = 2,432 bytes in 5 blocks; the label: a
    # header and a block; the shard's two end blocks shared by 4 samples: 4,352 bytes each.
    assert "pixels 32x24: uint8 height x width x 3 in KEY.pixels.npy" in out
    assert "4.4 KB per sample" in out
    assert "sizes in shard-000000.tar's index (4 samples): height 24..24, width 32..32" in out
    assert main(["build", "-q", str(root), str(tmp_path / "bad"), "--pixels", "32"]) == 1
    assert "pixels must be 'short=N'" in capsys.readouterr().err


def test_verify_decode_checks_pixel_members_as_readers_read_them(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_image_folder(tmp_path / "images", num_classes=1, per_class=3, size=(40, 30))
    dest = tmp_path / "ds"
    build_shards(root, dest, pixels="short=10", shuffle=False)
    assert main(["verify", str(dest), "--decode", "-q"]) == 0
    shard = dest / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"'shape': (10, 13, 3)")  # the first sample's header: another height
    data[at : at + 20] = b"'shape': (11, 13, 3)"
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(dest), "--decode", "-q"]) == 1
    out = capsys.readouterr().out
    assert "UNDECODABLE shard-000000.tar: key 'class_00/img_00000' member 'pixels.npy'" in out
    assert "of shape (11, 13, 3) needs 557 bytes" in out
