"""Progress bars on every long command line step, on a terminal only, and never with --quiet.

The command runs in a subprocess whose stderr is a pseudo-terminal (what a user's shell gives
it), or a pipe (a log file, CI), and what it wrote there is read back.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import pty
import struct
import subprocess
import sys
import termios

import pytest

from shardstream.shardwriter import build_shards
from tests.conftest import write_image_folder
from tests.streaming.shards import make_samples


def _run(args: list[str], terminal: bool = True) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``python -m shardstream ARGS``."""
    command = [sys.executable, "-m", "shardstream", *args]
    if not terminal:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        return result.returncode, result.stderr
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=side)
    os.close(side)
    written = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        written += chunk
    os.close(main)
    return process.wait(timeout=120), written.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("progress") / "data"
    build_shards(make_samples(24, num_classes=3), root, max_samples_per_shard=4)
    return root


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["verify", "{data}"], "verifying: 100%"),
        (["view", "{data}", "{tmp}/view{run}", "--fraction", "0.5"], "reading indexes: 100%"),
        (["inspect", "{data}", "--classes", "3"], "reading labels: 100%"),
        (["index", "{data}", "{tmp}/index{run}"], "6/6"),
    ],
    ids=["verify", "view", "inspect-classes", "index"],
)
def test_long_steps_show_a_bar_on_a_terminal_only(
    dataset: pathlib.Path, tmp_path: pathlib.Path, args: list[str], shown: str
) -> None:
    def argv(run: int) -> list[str]:
        return [arg.format(data=dataset, tmp=tmp_path, run=run) for arg in args]

    code, written = _run(argv(0))
    assert code == 0 and shown in written, written
    assert _run([*argv(1), "--quiet"]) == (0, "")
    assert _run(argv(2), terminal=False) == (0, "")


def test_the_build_bar_counts_files_while_it_scans(tmp_path: pathlib.Path) -> None:
    images = write_image_folder(tmp_path / "images", num_classes=2, per_class=300, png_every=0,
                                size=(8, 8))  # fmt: skip
    code, written = _run(["build", str(images), str(tmp_path / "out")])
    assert code == 0 and "scanning" in written and "writing: 100%" in written, written
    assert "600/600" in written
    code, written = _run(["-q", "build", str(images), str(tmp_path / "out2")])
    assert (code, written) == (0, "")


def test_a_scan_reports_the_files_it_has_found(tmp_path: pathlib.Path) -> None:
    images = write_image_folder(tmp_path / "images", num_classes=2, per_class=300, png_every=0,
                                size=(8, 8))  # fmt: skip
    calls: list[tuple[int, int, int | None, int | None]] = []
    build_shards(images, tmp_path / "out", progress=lambda *call: calls.append(call))
    scanning = [call for call in calls if call[2] is None]
    assert [call[0] for call in scanning] == [0, 256, 512, 600]  # as it goes, then all found
    assert scanning[-1][1] == sum(p.stat().st_size for p in images.rglob("*.jpg"))
    writing = calls[len(scanning) :]
    assert writing and all(call[2] == 600 for call in writing) and writing[-1][0] == 600
