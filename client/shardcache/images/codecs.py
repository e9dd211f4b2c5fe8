"""The CPU codecs: read an image's size from its header, decode the region of a crop box at the target size.

Two backends, one contract (`decode_region(data, box, size) -> Decoded`):

- `pil`, the reference: Pillow decodes the whole image, crops the box, resizes it (bilinear, with Pillow's
  antialiasing: what torchvision's PIL pipeline does). JPEG, PNG, WebP and whatever else Pillow opens.
  `draft=True` lets Pillow's JPEG plugin decode at a reduced DCT scale first (`Image.draft`); off by default
  so the reference stays the plain decode -> crop -> resize.
- `turbo`: libjpeg-turbo through `simplejpeg`, for baseline and progressive JPEGs in YCbCr or grayscale.
  When the box is at least twice the target in both directions, the JPEG is decoded at 1/2, 1/4 or 1/8 scale
  in the DCT domain (`dct_factor`): the inverse DCT, colour conversion and upsampling then do a quarter to a
  sixty-fourth of the work. The box is cut from the decoded array before the final resize. Other formats
  (PNG, WebP, CMYK JPEGs) go to Pillow.

simplejpeg does not expose libjpeg-turbo's partial decode (`jpeg_skip_scanlines`/`jpeg_crop_scanline`), so
the rows and columns outside the box are still decoded, at the reduced scale.

A malformed image raises `BadImage` (the decoder adds the sample's key and shard); a missing package raises
a ConfigError naming `pip install 'shardcache[images]'`.
"""

from __future__ import annotations

import io
import math
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from shardcache.errors import ConfigError
from shardcache.images.crop import CropBox

if TYPE_CHECKING:
    import PIL.Image

BACKENDS = ("auto", "pil", "turbo")
JPEG_MAGIC = b"\xff\xd8\xff"
# libjpeg-turbo converts these JPEG colour spaces to RGB; CMYK and YCCK go to Pillow (it inverts Adobe CMYK).
TURBO_COLORSPACES = frozenset({"YCbCr", "Gray", "RGB"})
EXTRA = "pip install 'shardcache[images]'"


class BadImage(Exception):
    """The bytes are not a decodable image; the message says what the codec found."""


class Header(NamedTuple):
    """What the header says: the full size, and whether libjpeg-turbo decodes the image (else `opened` is
    Pillow's lazily opened image, which the Pillow backend decodes without parsing the header again)."""

    width: int
    height: int
    turbo: bool
    opened: PIL.Image.Image | None = None


class Decoded(NamedTuple):
    """A decoded crop, `size` x 3 uint8 (HWC, RGB), and the size (height, width) the codec decoded the whole
    image at before cropping: the full size, or a DCT-scaled one."""

    image: npt.NDArray[np.uint8]
    decoded_size: tuple[int, int]


def pil() -> ModuleType:
    """`PIL.Image`, or a ConfigError naming the extra."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ConfigError(f"shardcache.images needs Pillow ({exc}): {EXTRA}") from exc
    return Image


def turbo() -> ModuleType:
    """`simplejpeg` (libjpeg-turbo), or a ConfigError naming the extra."""
    try:
        import simplejpeg
    except ImportError as exc:
        raise ConfigError(f"the turbo image backend needs simplejpeg ({exc}): {EXTRA}") from exc
    module: ModuleType = simplejpeg  # untyped: no stubs
    return module


def preload(backend: str) -> bool:
    """Import what decoding with `backend` needs, now, and say whether JPEGs go to libjpeg-turbo.

    Called where the pipeline is built, before DataLoader workers fork: Pillow otherwise imports most of its
    format plugins on the first image it cannot identify from the few it loads first (a WebP, say), and a
    forked worker must not import lazily (`shardcache.forksafe`, rule 1).
    """
    pil().init()
    if backend == "turbo":
        turbo()
        return True
    return backend == "auto" and has_turbo()


def has_turbo() -> bool:
    """Whether simplejpeg is installed (backend="auto" then decodes JPEGs with it)."""
    try:
        turbo()
    except ConfigError:
        return False
    return True


def read_header(data: bytes, use_turbo: bool) -> Header:
    """The image's full width and height from its header, without decoding pixels."""
    if use_turbo and data[:3] == JPEG_MAGIC:
        try:
            height, width, colorspace, _ = turbo().decode_jpeg_header(data)
        except ValueError as exc:
            raise BadImage(f"invalid JPEG header ({exc})") from exc
        if colorspace in TURBO_COLORSPACES:
            return Header(int(width), int(height), True)
    image = _open(data)
    width, height = image.size
    return Header(int(width), int(height), False, image)


def dct_factor(box: CropBox, size: tuple[int, int]) -> int:
    """The largest DCT scale divisor (8, 4, 2; else 1) that keeps the box at least `size` (height, width)."""
    out_h, out_w = size
    for factor in (8, 4, 2):
        if box.height >= factor * out_h and box.width >= factor * out_w:
            return factor
    return 1


def decode_turbo(data: bytes, header: Header, box: CropBox, size: tuple[int, int]) -> Decoded:
    """Decode a JPEG with libjpeg-turbo at the DCT scale `dct_factor` allows, cut `box`, resize to `size`."""
    factor = dct_factor(box, size)
    try:
        array = turbo().decode_jpeg(
            data,
            colorspace="RGB",
            # Exactly 1/factor: a larger divisor would go below these sizes, a smaller one below min_factor.
            min_factor=factor,
            min_height=math.ceil(header.height / factor),
            min_width=math.ceil(header.width / factor),
        )
    except ValueError as exc:
        raise BadImage(f"invalid or truncated JPEG ({exc})") from exc
    decoded = (int(array.shape[0]), int(array.shape[1]))
    sy, sx = decoded[0] / header.height, decoded[1] / header.width
    box_f = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
    return Decoded(_crop_resize(array, box_f, size), decoded)


def decode_pil(
    data: bytes, header: Header, box: CropBox, size: tuple[int, int], draft: bool = False
) -> Decoded:
    """The reference: Pillow decodes, crops `box`, resizes to `size` (bilinear). `draft`: see the module."""
    Image = pil()
    image = header.opened if header.opened is not None else _open(data)
    out_h, out_w = size
    try:
        if draft and image.format == "JPEG" and (factor := dct_factor(box, size)) > 1:
            image.draft("RGB", (header.width // factor, header.height // factor))
            sx, sy = image.size[0] / header.width, image.size[1] / header.height
            rgb = image.convert("RGB")
            box_f = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
            return Decoded(_crop_resize(np.asarray(rgb), box_f, size), (rgb.size[1], rgb.size[0]))
        rgb = image.convert("RGB")
        region = rgb.crop((box.left, box.top, box.left + box.width, box.top + box.height))
        out = region.resize((out_w, out_h), Image.Resampling.BILINEAR)
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's plugins raise all three for bad data
        raise BadImage(f"cannot decode {image.format or 'image'} ({exc})") from exc
    return Decoded(np.array(out), (rgb.size[1], rgb.size[0]))


def _open(data: bytes) -> PIL.Image.Image:
    """Pillow's lazy open (reads the header only); BadImage if it is no image Pillow knows."""
    Image = pil()
    try:
        opened: PIL.Image.Image = Image.open(io.BytesIO(data))
        return opened
    except (OSError, ValueError, SyntaxError) as exc:  # UnidentifiedImageError is an OSError
        raise BadImage(f"not an image Pillow can open ({exc})") from exc


def _crop_resize(
    array: npt.NDArray[np.uint8],
    box: tuple[float, float, float, float],
    size: tuple[int, int],
) -> npt.NDArray[np.uint8]:
    """Cut the whole pixels around the (fractional) `box` (left, top, right, bottom) out of `array`, then
    resize exactly `box` to `size` (height, width) with Pillow's bilinear filter."""
    Image = pil()
    left, top, right, bottom = box
    x0, y0 = math.floor(left), math.floor(top)
    x1, y1 = min(array.shape[1], math.ceil(right)), min(array.shape[0], math.ceil(bottom))
    region = np.ascontiguousarray(array[y0:y1, x0:x1])
    image = Image.fromarray(region, "RGB")
    out_h, out_w = size
    inner = (left - x0, top - y0, min(right, x1) - x0, min(bottom, y1) - y0)
    return np.array(image.resize((out_w, out_h), Image.Resampling.BILINEAR, box=inner))


def decode_box(
    data: bytes, header: Header, box: CropBox, size: tuple[int, int], draft: bool = False
) -> Decoded:
    """Decode `box` of the image at `size` with the backend `header` chose (`read_header`'s `use_turbo`)."""
    if header.turbo:
        return decode_turbo(data, header, box, size)
    return decode_pil(data, header, box, size, draft)
