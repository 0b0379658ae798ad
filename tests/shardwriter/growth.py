"""Helpers for datasets that grow: one ImageFolder tree per day, with keys unique across days."""

from __future__ import annotations

import pathlib

from ..conftest import encode_image


def write_day(
    root: pathlib.Path, day: int, per_class: int = 4, num_classes: int = 2
) -> pathlib.Path:
    """``class_XX/dayD_NNNN.jpg`` (every third a PNG); content seeded by day and number."""
    for number in range(per_class * num_classes):
        folder = root / f"class_{number % num_classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        png = number % 3 == 2
        data = encode_image(24, 16, seed=1000 * day + number, fmt="PNG" if png else "JPEG")
        (folder / f"day{day}_{number:04d}.{'png' if png else 'jpg'}").write_bytes(data)
    return root
