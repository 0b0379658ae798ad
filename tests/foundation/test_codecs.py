"""Member codecs: values round-trip by extension; pickle stays bytes unless opted in."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shardstream import DecodeError, SourceError
from shardstream._format.codecs import decode_member, encode_member, extension_of, is_image


@pytest.mark.parametrize(
    ("extension", "value"),
    [("cls", 7), ("json", {"a": [1, 2], "b": "x"}), ("txt", "héllo"), ("index", 0)],
)
def test_values_round_trip(extension: str, value: object) -> None:
    assert decode_member(extension, encode_member(extension, value)) == value


def test_bytes_pass_through_unchanged() -> None:
    data = b"\xff\xd8\xff\xe0 not really a jpeg"
    assert encode_member("jpg", data) == data
    assert decode_member("jpg", data) == data


def test_numpy_arrays_round_trip_without_pickle() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    decoded = decode_member("npy", encode_member("npy", array))
    np.testing.assert_array_equal(decoded, array)


def test_pickle_members_stay_bytes_unless_opted_in() -> None:
    data = pickle.dumps({"x": 1})
    assert decode_member("pyd", data) == data
    assert decode_member("pyd", data, allow_pickle=True) == {"x": 1}


def test_bad_label_names_the_sample_and_member() -> None:
    with pytest.raises(DecodeError, match=r"shard-1.tar:key7: member 'cls'"):
        decode_member("cls", b"not-an-int", where="shard-1.tar:key7")


def test_wrong_value_type_is_a_source_error() -> None:
    with pytest.raises(SourceError, match=r"key3.*'cls'.*int label"):
        encode_member("cls", "three", where="key3")
    with pytest.raises(SourceError, match="cannot encode"):
        encode_member("bin", object(), where="key4")


def test_extension_helpers() -> None:
    assert extension_of("seg.PNG") == "png"
    assert is_image("JPEG") and is_image("left.jpg") and not is_image("cls")


def test_gzipped_members_decode_by_their_inner_extension_as_webdataset_does() -> None:
    import gzip

    assert decode_member("txt.gz", gzip.compress("héllo".encode())) == "héllo"
    assert decode_member("json.gz", gzip.compress(b'{"a": 1}')) == {"a": 1}
    assert decode_member("bin.gz", gzip.compress(b"\0\1")) == b"\0\1"
    with pytest.raises(DecodeError, match=r"k\.txt\.gz.*'txt\.gz' \(5 bytes\) is not valid gzip"):
        decode_member("txt.gz", b"plain", "k.txt.gz")
