"""Image decode as a pipeline stage: JPEG, PNG and WebP fused with the crop, on a backend you pick.

An optional part of the client (`pip install 'shardcache[images]'`: Pillow and simplejpeg); `import
shardcache` does not load it. See docs/images.md.

Example:
    >>> from shardcache import Dataset, TorchLoader, images
    >>> ds = Dataset.from_source("tars", "s3://bucket/train/shard_{000000..000127}.tar")
    >>> train = ds.map(images.decode("jpg", size=224, seed=0))        # HWC uint8 arrays
    >>> loader = TorchLoader(train, num_workers=8, batch_size=256)     # doctest: +SKIP

Modules: `crop` (crop boxes from the header's size and a per-sample generator), `codecs` (the Pillow and
libjpeg-turbo backends, DCT scaling), `decoder` (the stage), `deferred` (compressed records and the batch
decode), `ahead` (decoding the next batches while the step runs).
"""

from __future__ import annotations

from shardcache.images.ahead import decode_ahead
from shardcache.images.codecs import BACKENDS, dct_factor
from shardcache.images.crop import CROPS, CropBox, crop_box, random_resized_box, sample_rng
from shardcache.images.decoder import EpochDecoder, ImageDecode
from shardcache.images.deferred import DeferredImage, decode_batch

__all__ = [
    "BACKENDS",
    "CROPS",
    "CropBox",
    "DeferredImage",
    "EpochDecoder",
    "ImageDecode",
    "crop_box",
    "dct_factor",
    "decode",
    "decode_ahead",
    "decode_batch",
    "random_resized_box",
    "sample_rng",
]


def decode(
    key: str = "jpg",
    size: int | tuple[int, int] = (224, 224),
    *,
    crop: str = "random_resized",
    backend: str = "auto",
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    seed: int | None = None,
    defer: bool = False,
    draft: bool = False,
    on_error: str = "raise",
) -> ImageDecode:
    """A stage that decodes `sample[key]` into an RGB crop of `size`: a (height, width, 3) uint8 numpy array.

    Use it as `ds.map(decoder)` (crops from (seed, `__key__`): the same every epoch) or as
    `ds.assemble(decoder.each_epoch)` (crops from (seed, epoch, `__key__`): new every epoch; `on_error="skip"`
    drops undecodable samples there).

    Args:
        key: the field holding the encoded image (JPEG, PNG, WebP, anything Pillow opens).
        size: the output (height, width), or one int for a square.
        crop: "random_resized" (torchvision's RandomResizedCrop parameters, `scale` and `ratio`), "center"
            (the central 224/256 of the largest region of the output's shape), or "none" (the whole image).
        backend: "pil" (the reference: Pillow decode, crop, resize), "turbo" (libjpeg-turbo through
            simplejpeg with DCT-domain downscaling for JPEGs; other formats through Pillow), or "auto"
            (turbo when simplejpeg is installed). The crop box does not depend on the backend.
        scale, ratio: RandomResizedCrop's area share and aspect-ratio ranges.
        seed: the crops' seed (None: 0 under `.map`, the pipeline's seed under `each_epoch`).
        defer: ship the compressed bytes and the crop box (`DeferredImage`) instead of pixels; decode the
            collated batch with `decode_batch` or `decode_ahead` in the main process.
        draft: let the Pillow backend decode JPEGs at a reduced DCT scale too (`Image.draft`).
        on_error: "raise" (a `CorruptImageError` naming the shard, key and field) or "skip" (under
            `each_epoch`: the sample is dropped and logged).

    Raises:
        ConfigError: a bad argument, or Pillow (or, for backend="turbo", simplejpeg) not installed: the
            message names `pip install 'shardcache[images]'`.
    """
    pair = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return ImageDecode(key, pair, crop, backend, scale, ratio, seed, defer, draft, on_error)
