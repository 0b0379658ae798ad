"""Shared fixtures: tiny real JPEG and PNG images laid out as an ImageFolder tree."""

from __future__ import annotations

import io
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image


def encode_image(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    """A real image with content that depends on ``seed`` (so samples are distinguishable)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(1, 1, 3), dtype=np.uint8)
    noise = rng.integers(0, 64, size=(height, width, 3), dtype=np.uint8)
    pixels = (base.astype(np.uint16) + noise).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    options = {"quality": 90} if fmt == "JPEG" else {}
    Image.fromarray(pixels, "RGB").save(buffer, format=fmt, **options)
    return buffer.getvalue()


def write_image_folder(
    root: pathlib.Path,
    num_classes: int = 3,
    per_class: int = 4,
    size: tuple[int, int] = (32, 24),
    png_every: int = 3,
    nested: bool = True,
) -> pathlib.Path:
    """Write ``class_XX/[sub/]img_NNNN.(jpg|png)`` files; every ``png_every``-th image is a PNG."""
    index = 0
    for label in range(num_classes):
        for item in range(per_class):
            folder = root / f"class_{label:02d}"
            if nested and item % 2 == 1:
                folder = folder / "sub"
            folder.mkdir(parents=True, exist_ok=True)
            is_png = png_every > 0 and index % png_every == png_every - 1
            data = encode_image(*size, seed=index, fmt="PNG" if is_png else "JPEG")
            (folder / f"img_{index:05d}.{'png' if is_png else 'jpg'}").write_bytes(data)
            index += 1
    return root


@pytest.fixture
def image_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A 3-class ImageFolder tree of 12 real JPEG/PNG images, some in nested folders."""
    return write_image_folder(tmp_path / "images")


@pytest.fixture
def make_image_folder(tmp_path: pathlib.Path) -> Callable[..., pathlib.Path]:
    """Factory: ``make_image_folder(num_classes=..., per_class=..., ...)`` in a fresh folder."""
    counter = iter(range(1_000_000))

    def make(**kwargs: object) -> pathlib.Path:
        return write_image_folder(tmp_path / f"images{next(counter)}", **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests talk to servers on 127.0.0.1 only; a stray proxy setting must not route them away.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules made mostly of ``slow`` tests run first (a module of one long multi-process test
    before a module with a few among many quick ones), each module's tests still together (so
    module fixtures are built once) and in their order. With ``-n 2 --dist worksteal`` (the
    README's test command) the two workers then share out the long tests early and end on
    short ones, instead of one worker finishing alone on a long test."""
    counts: dict[str, list[int]] = {}
    for item in items:
        slow_and_all = counts.setdefault(item.nodeid.split("::", 1)[0], [0, 0])
        slow_and_all[0] += item.get_closest_marker("slow") is not None
        slow_and_all[1] += 1
    items.sort(
        key=lambda item: (
            -counts[item.nodeid.split("::", 1)[0]][0] / counts[item.nodeid.split("::", 1)[0]][1]
        )
    )
