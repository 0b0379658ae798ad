"""Build options: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardstream.errors import ConfigError
from shardstream.format.pixels import PixelSize

__all__ = ["DEFAULT_MAX_BYTES", "BuildOptions"]

DEFAULT_MAX_BYTES = 256 * 10**6
ON_ERROR_CHOICES = ("raise", "skip")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How :func:`~shardstream.build_shards` cuts, orders and encodes samples.

    Attributes:
        max_samples_per_shard: Most samples in one shard (``None``: no limit but bytes).
        max_bytes_per_shard: Most bytes in one shard file, tar end blocks included. A single
            sample larger than this gets a shard of its own (and a warning).
        workers: Local worker processes when no executor is passed; 1 builds in-process.
            The output is identical for any value.
        seed: Seed of the global shuffle (``numpy.random.default_rng(seed)``).
        shuffle: Shuffle samples across the whole source (file sources only); ``False`` keeps
            source order.
        resize: Shrink images so that their shorter side is at most this many pixels, and
            write JPEG. ``None`` passes the original bytes through.
        quality: JPEG quality when re-encoding (implies JPEG output); ``None`` means 90 when
            ``resize`` is set, else no re-encoding.
        pixels: Store every image decoded once, as ``uint8`` pixels in a ``KEY.pixels.npy``
            member (what ``numpy.load`` reads), at this size: ``"short=N"`` (shorter side
            exactly N pixels, aspect kept) or ``"WxH"`` (a fixed box, aspect not kept), e.g.
            ``"short=256"``; readers then skip the decode (images only, from file sources).
            Excludes ``resize`` and ``quality``. ``None`` stores encoded images.
        on_error: ``"raise"`` stops at the first unreadable item or image that fails the
            build's check; ``"skip"`` leaves it out, logs it and lists it in
            ``manifest.skipped``. Passed-through images are checked by signature and end
            marker (JPEG, PNG) or header (others), not decoded: damage inside an image's data
            is found by ``shardstream verify --decode`` (re-encoding with ``resize``,
            ``quality`` or ``pixels`` decodes every image, so it finds it too).
        overwrite: Replace a different dataset or unfinished build already in DEST.
        append: Add the source's samples to the dataset in DEST as new shards after its
            shards, and publish a new version of it.

    Examples:
        >>> BuildOptions(max_samples_per_shard=1000, resize=256).reencodes
        True
    """

    max_samples_per_shard: int | None = None
    max_bytes_per_shard: int = DEFAULT_MAX_BYTES
    workers: int = 1
    seed: int = 0
    shuffle: bool = True
    resize: int | None = None
    quality: int | None = None
    on_error: str = "raise"
    overwrite: bool = False
    append: bool = False
    pixels: str | None = None  # last: positional arguments keep their places

    def __post_init__(self) -> None:
        if self.max_samples_per_shard is not None and self.max_samples_per_shard < 1:
            raise ConfigError(
                f"max_samples_per_shard must be >= 1, got {self.max_samples_per_shard}"
            )
        if self.max_bytes_per_shard < 4096:
            raise ConfigError(
                f"max_bytes_per_shard must be >= 4096 bytes, got {self.max_bytes_per_shard}"
            )
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.resize is not None and self.resize < 1:
            raise ConfigError(f"resize (shorter side in pixels) must be >= 1, got {self.resize}")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise ConfigError(f"quality must be between 1 and 100, got {self.quality}")
        if self.pixels is not None:  # one spelling, in the manifest too
            object.__setattr__(self, "pixels", str(PixelSize.parse(str(self.pixels))))
            if self.resize is not None or self.quality is not None:
                raise ConfigError(
                    "pixels stores decoded pixels; resize and quality re-encode JPEG: pass "
                    "pixels alone (its size replaces resize)"
                )
        if self.append and self.overwrite:
            raise ConfigError("append and overwrite exclude each other: choose one")
        if self.on_error not in ON_ERROR_CHOICES:
            raise ConfigError(f"on_error must be one of {ON_ERROR_CHOICES}, got {self.on_error!r}")

    @property
    def reencodes(self) -> bool:
        """True when images are decoded and written again (as JPEG, or as pixels)."""
        return self.resize is not None or self.quality is not None or self.pixels is not None

    def output_settings(self) -> dict[str, Any]:
        """The settings that determine the output bytes (recorded in the manifest)."""
        settings = dataclasses.asdict(self)
        del settings["workers"], settings["overwrite"], settings["append"]
        if settings["pixels"] is None:  # absent, as in manifests written before the option
            del settings["pixels"]
        return settings
