"""A JPEG damaged inside its compressed data (markers intact) passes the build's cheap check and
`verify`; `verify --decode` decodes every image as training does and names it."""

from __future__ import annotations

import io
import pathlib

import pytest
from PIL import Image

from shardstream import DecodeError, StreamingDataLoader, StreamingDataset
from shardstream._cli import main
from tests.conftest import encode_image, write_image_folder


def _damaged_jpeg() -> bytes:
    data = bytearray(encode_image(64, 64, seed=5))
    start = data.find(b"\xff\xda")  # the scan: compressed data follows
    middle = (start + len(data)) // 2
    for at in range(middle, middle + 200):
        data[at] = 0xFF if at % 7 == 0 else data[at] ^ 0x5A
    assert data.startswith(b"\xff\xd8\xff") and data.endswith(b"\xff\xd9")  # markers intact
    with pytest.raises(OSError), Image.open(io.BytesIO(bytes(data))) as image:
        image.load()
    return bytes(data)


def test_verify_decode_names_a_jpeg_damaged_in_the_middle(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = write_image_folder(tmp_path / "images")
    (images / "class_01" / "zz_damaged.jpg").write_bytes(_damaged_jpeg())
    dest = tmp_path / "ds"
    assert main(["build", str(images), str(dest), "-q"]) == 0  # the cheap check passes it
    assert main(["verify", str(dest), "-q"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["verify", str(dest), "--decode", "-q"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "UNDECODABLE shard-000000.tar: key 'class_01/zz_damaged' member 'jpg' does not decode "
        "(broken data stream when reading image file)"
    ], captured.out
    assert "1 problem(s)" in captured.err
    with pytest.raises(DecodeError, match="zz_damaged"):  # what training would meet
        list(StreamingDataLoader(StreamingDataset(dest, batch_size=4), num_workers=0))
    good = tmp_path / "good"
    (images / "class_01" / "zz_damaged.jpg").unlink()
    assert main(["build", str(images), str(good), "-q"]) == 0
    capsys.readouterr()
    assert main(["verify", str(good), "--decode", "-q"]) == 0
    assert "every image decodes" in capsys.readouterr().out
