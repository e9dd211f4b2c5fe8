"""Which region of an image to decode: crop boxes drawn from the image's size alone, never from its pixels.

The box is chosen before any pixel is decoded (from the header's width and height), so every backend cuts the
same region for a given random generator, and a decoder can skip what lies outside it or decode at a smaller
DCT scale. The generator comes from (seed, epoch, sample key): the same sample gets the same crop in every
worker, after a resume, and whichever backend decodes it.

`random_resized_box` is torchvision's `RandomResizedCrop.get_params` (10 draws of an area share and a
log-uniform aspect ratio, then the central fallback) on Python's `random.Random` instead of torch's global
generator.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

# What `crop=` accepts: torchvision's RandomResizedCrop; the central region of the target's aspect ratio
# (ImageNet's evaluation crop: Resize(256) + CenterCrop(224) keeps 224/256 of the short side); the whole
# image.
CROPS = ("random_resized", "center", "none")
CENTER_FRACTION = 224 / 256


class CropBox(NamedTuple):
    """A region of the full-size image, in pixels: rows `top:top+height`, columns `left:left+width`."""

    top: int
    left: int
    height: int
    width: int


def sample_rng(seed: int, key: str, epoch: int = 0) -> random.Random:
    """The generator of one sample's crop: a function of (seed, epoch, key) only.

    Seeding `random.Random` with a string hashes it with SHA-512 (not Python's per-process `hash`), so
    every process draws the same numbers.
    """
    return random.Random(f"shardcache.images/{seed}/{epoch}/{key}")


def random_resized_box(
    width: int,
    height: int,
    rng: random.Random,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> CropBox:
    """torchvision's RandomResizedCrop region for an image of `width` x `height`.

    Example:
        >>> random_resized_box(500, 375, sample_rng(0, "s000_0000"))  # doctest: +SKIP
        CropBox(top=91, left=143, height=201, width=233)
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return CropBox(top, left, h, w)
    # Fallback: the central crop, clamped to the ratio range.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def center_box(width: int, height: int, size: tuple[int, int], fraction: float = CENTER_FRACTION) -> CropBox:
    """The central region with the aspect ratio of `size` (height, width), `fraction` of the largest such."""
    out_h, out_w = size
    fit = min(width / out_w, height / out_h)  # the largest region of the target's shape inside the image
    w = max(1, min(width, round(out_w * fit * fraction)))
    h = max(1, min(height, round(out_h * fit * fraction)))
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def crop_box(
    crop: str,
    width: int,
    height: int,
    size: tuple[int, int],
    rng: random.Random | None,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> CropBox:
    """The region `crop` (one of `CROPS`) takes from a `width` x `height` image; `rng` for random crops."""
    if crop == "random_resized":
        if rng is None:
            raise ValueError("a random crop needs a generator")
        return random_resized_box(width, height, rng, scale, ratio)
    if crop == "center":
        return center_box(width, height, size)
    return CropBox(0, 0, height, width)
