"""ImageFolder trees with symbolic links: followed like torchvision's, cycles and broken links."""

from __future__ import annotations

import logging
import os
import pathlib

import pytest

from shardstream._cli import main
from shardstream.errors import SourceError
from shardstream.shardwriter import build_shards

from ..conftest import write_image_folder
from .helpers import manifest_of, read_with_webdataset


def _images_by_key(dest: pathlib.Path) -> dict[str, tuple[bytes, int]]:
    """key -> (image bytes, label) of every sample of a built dataset."""
    return {
        s["__key__"]: (s["jpg"] if "jpg" in s else s["png"], int(s["cls"]))
        for s in read_with_webdataset(dest)
    }


def _tree_with_links(tmp_path: pathlib.Path) -> pathlib.Path:
    """Two real classes; ``class_00/extra`` links outside, ``class_01/twin`` to a sibling."""
    root = write_image_folder(tmp_path / "images", num_classes=2, per_class=4)
    write_image_folder(tmp_path / "outside", num_classes=1, per_class=2, nested=False)
    (root / "class_00" / "extra").symlink_to(tmp_path / "outside" / "class_00")
    # A link to a folder that is not one of its ancestors is not a cycle.
    (root / "class_01" / "twin").symlink_to(pathlib.Path("..") / "class_00" / "sub")
    return root


def test_followed_folder_links_reach_the_dataset(tmp_path):
    root = _tree_with_links(tmp_path)
    manifest = build_shards(root, tmp_path / "out", max_samples_per_shard=3)
    samples = _images_by_key(tmp_path / "out")
    outside = tmp_path / "outside" / "class_00"
    for path in sorted(outside.iterdir()):
        assert samples[f"class_00/extra/{path.stem}"] == (path.read_bytes(), 0)
    for path in sorted((root / "class_00" / "sub").iterdir()):
        # The same file through its real folder and through the sibling link: two samples.
        assert samples[f"class_00/sub/{path.stem}"] == (path.read_bytes(), 0)
        assert samples[f"class_01/twin/{path.stem}"] == (path.read_bytes(), 1)
    assert manifest.num_samples == len(samples) == 8 + 2 + 2


def test_scan_matches_torchvision_image_folder(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    root = _tree_with_links(tmp_path)
    (root / "class_02").symlink_to(tmp_path / "outside" / "class_00")
    build_shards(root, tmp_path / "out")
    reference = datasets.ImageFolder(str(root))
    expected = {
        (str(pathlib.Path(path).relative_to(root).with_suffix("").as_posix()), label)
        for path, label in reference.samples
    }
    found = {(key, label) for key, (_, label) in _images_by_key(tmp_path / "out").items()}
    assert found == expected
    assert manifest_of(tmp_path / "out").class_names == tuple(reference.classes)


def test_a_class_folder_may_be_a_link(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=2, per_class=3)
    elsewhere = write_image_folder(tmp_path / "elsewhere", num_classes=1, per_class=3)
    (root / "class_01b").symlink_to(elsewhere / "class_00", target_is_directory=True)
    manifest = build_shards(root, tmp_path / "out")
    assert manifest.class_names == ("class_00", "class_01", "class_01b")
    samples = _images_by_key(tmp_path / "out")
    linked = {key: label for key, (_, label) in samples.items() if key.startswith("class_01b/")}
    assert len(linked) == 3 and set(linked.values()) == {2}
    nested = next((elsewhere / "class_00" / "sub").iterdir())
    assert samples[f"class_01b/sub/{nested.stem}"][0] == nested.read_bytes()


def test_a_link_to_an_ancestor_is_a_source_error_naming_both(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=2, per_class=4)
    link = root / "class_01" / "sub" / "up"
    link.symlink_to(pathlib.Path("..") / "..")
    with pytest.raises(SourceError) as caught:
        build_shards(root, tmp_path / "out")
    message = str(caught.value)
    assert message.startswith(f"{link}: symbolic link to '../..' that leads back to {root},")
    assert "forever" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("where", "target"),
    [("class_00/here", "."), ("class_00/sub/top", "../.."), ("again", ".")],
    ids=["self", "class-folder", "root-as-class"],
)
def test_self_loops_are_source_errors(make_image_folder, tmp_path, where, target):
    root = make_image_folder(num_classes=2, per_class=4)
    (root / where).symlink_to(target)
    looped = os.path.normpath(root / where / ".." / target).rstrip("/")
    with pytest.raises(SourceError, match="leads back to") as caught:
        build_shards(root, tmp_path / "out")
    assert str(caught.value).startswith(f"{root / where}: symbolic link to {target!r}")
    assert f"leads back to {looped}," in str(caught.value)


def test_cli_prints_one_clean_error_line_for_a_loop(make_image_folder, tmp_path, capsys):
    root = make_image_folder(num_classes=2, per_class=2)
    (root / "class_00" / "loop").symlink_to(root)
    assert main(["build", str(root), str(tmp_path / "out"), "--quiet"]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"error: {root / 'class_00' / 'loop'}: symbolic link to ")
    assert "--storage-option" not in captured.err and "Errno" not in captured.err
    assert captured.out == ""


def test_a_broken_image_link_is_an_error_unless_skipped(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=2, per_class=2)
    gone = root / "class_01" / "gone.jpg"
    gone.symlink_to(tmp_path / "missing.jpg")
    with pytest.raises(SourceError) as caught:
        build_shards(root, tmp_path / "out")
    assert str(caught.value).startswith(f"{gone}: broken symbolic link (to ")
    assert "No such file or directory" in str(caught.value)
    assert "on_error='skip'" in str(caught.value)
    manifest = build_shards(root, tmp_path / "out", on_error="skip")
    assert manifest.num_samples == 4
    assert [item.source for item in manifest.skipped] == [str(gone)]
    assert manifest.settings["source_items"] == 5


def test_a_link_to_itself_is_a_broken_link(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=1, per_class=2)
    itself = root / "class_00" / "itself.png"
    itself.symlink_to("itself.png")  # the OS reports ELOOP when following it
    with pytest.raises(SourceError, match=f"^{itself}: broken symbolic link"):
        build_shards(root, tmp_path / "out")


def test_other_broken_links_are_ignored_with_a_warning(make_image_folder, tmp_path, caplog):
    root = make_image_folder(num_classes=2, per_class=2)
    (root / "class_00" / "was_a_folder").symlink_to(tmp_path / "nowhere")
    (root / "class_zz").symlink_to(tmp_path / "nowhere")
    (root / ".hidden.jpg").symlink_to(tmp_path / "nowhere")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        manifest = build_shards(root, tmp_path / "out")
    assert manifest.class_names == ("class_00", "class_01")
    assert manifest.num_samples == 4 and manifest.skipped == ()
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warnings == [
        f"{root / 'class_00' / 'was_a_folder'}: broken symbolic link (to "
        f"{str(tmp_path / 'nowhere')!r}: No such file or directory), ignored",
        f"{root / 'class_zz'}: broken symbolic link (to {str(tmp_path / 'nowhere')!r}: "
        "No such file or directory), not used as a class folder",
    ]
