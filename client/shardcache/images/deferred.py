"""Keep bytes compressed until late: what workers ship instead of pixels, and the decode of a whole batch.

A worker running `images.decode(..., defer=True)` reads only the image's header, draws the crop, and ships a
`DeferredImage`: the compressed bytes and seven integers (a 224x224 JPEG crop of a 500x375 photo: ~30 KB
pickled instead of 147 KB of pixels). torch's `default_collate` turns a list of them into one
`DeferredImage` whose `data` is the list of byte strings and whose other fields are int64 tensors;
`decode_batch` takes either form and returns the same (batch, height, width, 3) uint8 tensor the eager path
collates to (the same crops; the same pixels on the same backend).

Where the batch is decoded (`device=`):

- "cpu": each image with the CPU codecs (`shardcache.images.codecs`), in the calling thread. Tested.
- "cuda" (or "auto" when `torch.cuda.is_available()` and torchvision is installed): JPEGs with nvJPEG through
  `torchvision.io.decode_jpeg(device=...)` on the current CUDA stream, the crop cut from the decoded image
  and resized with `torch.nn.functional.interpolate(mode="bilinear", antialias=True)`; other formats on the
  CPU. **Not run on a GPU yet: a design, untested there and unmeasured.** nvJPEG decodes at full size (no
  DCT scaling) and its resize rounds differently from Pillow's, so pixels differ from the CPU path's by the
  decoders' rounding; the crop boxes are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shardcache.errors import ConfigError, CorruptImageError
from shardcache.images.codecs import JPEG_MAGIC, BadImage, decode_box, has_turbo, read_header
from shardcache.images.crop import CropBox

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


class DeferredImage(NamedTuple):
    """An image still compressed, with the crop to take from it and the size to decode it at."""

    data: bytes
    top: int
    left: int
    height: int
    width: int
    out_height: int
    out_width: int
    key: str = ""  # the sample's __key__, for error messages

    @property
    def box(self) -> CropBox:
        return CropBox(self.top, self.left, self.height, self.width)


def unbatch_deferred(images: DeferredImage | Sequence[DeferredImage]) -> list[DeferredImage]:
    """The records of a batch: a list of them as they are, or one collated by torch's default_collate."""
    if isinstance(images, DeferredImage) and not isinstance(images.data, bytes | bytearray | memoryview):
        columns = [images.data, *(_ints(c) for c in images[1:7]), list(images.key)]
        return [DeferredImage(bytes(d), *rest) for d, *rest in zip(*columns, strict=True)]
    if isinstance(images, DeferredImage):
        return [images]
    return list(images)


def resolve_device(device: str) -> str:
    """ "cpu" or a CUDA device name: "auto" is CUDA when torch sees a GPU and torchvision is installed."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ConfigError(f"device={device!r}: expected one of {DEVICES} or 'cuda:N'")
    if device == "cpu":
        return "cpu"
    th = _torch()
    gpu = th.cuda.is_available() and _has_torchvision()
    if device == "auto":
        return "cuda" if gpu else "cpu"
    if not gpu:
        raise ConfigError(
            f"device={device!r}: decoding on the GPU needs CUDA (torch.cuda.is_available() is False here) "
            f"and torchvision (`pip install torchvision` matching your torch); use device='cpu' or 'auto'"
        )
    return device


def decode_batch(
    images: DeferredImage | Sequence[DeferredImage], *, device: str = "cpu", backend: str = "auto"
) -> torch.Tensor:
    """Decode a batch of `DeferredImage`s into one (batch, height, width, 3) uint8 tensor on `device`.

    Args:
        images: the records as a list, or collated by torch's `default_collate`.
        device: "cpu" (tested), "cuda"/"cuda:N" (nvJPEG; not yet run on a GPU), or "auto" (CUDA when
            available, else the CPU).
        backend: the CPU codec, as in `images.decode` ("auto", "pil", "turbo").

    Raises:
        CorruptImageError: a record's bytes do not decode (named by its sample key). The worker read their
            header already, so only a body that is damaged past its header gets here.
    """
    th = _torch()  # the module, or a ConfigError naming the extra
    records = unbatch_deferred(images)
    where = resolve_device(device)
    if where != "cpu":
        return _decode_cuda(records, where, backend)
    use_turbo = backend != "pil" and has_turbo()
    arrays = [_decode_cpu(r, use_turbo) for r in records]
    if not arrays:
        raise ConfigError("decode_batch: the batch holds no image")
    batch: torch.Tensor = th.from_numpy(np.stack(arrays))
    return batch


def _decode_cpu(record: DeferredImage, use_turbo: bool) -> npt.NDArray[np.uint8]:
    try:
        header = read_header(record.data, use_turbo)
        return decode_box(record.data, header, record.box, (record.out_height, record.out_width)).image
    except BadImage as exc:
        raise CorruptImageError.of("(a deferred batch)", record.key, "data", str(exc)) from exc


def _decode_cuda(records: list[DeferredImage], device: str, backend: str) -> torch.Tensor:
    """nvJPEG through torchvision for JPEGs, the CPU for the rest. UNTESTED ON A GPU (see the module)."""
    import torch
    import torch.nn.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = [i for i, r in enumerate(records) if r.data[:3] == JPEG_MAGIC]
    encoded = [torch.from_numpy(np.frombuffer(records[i].data, dtype=np.uint8).copy()) for i in jpegs]
    decoded = dict(zip(jpegs, decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device), strict=True))
    out = []
    for i, r in enumerate(records):
        if i not in decoded:
            host = _decode_cpu(r, backend != "pil" and has_turbo())
            out.append(torch.from_numpy(host).to(device, non_blocking=True))
            continue
        region = decoded[i][:, r.top : r.top + r.height, r.left : r.left + r.width].unsqueeze(0).float()
        resized = F.interpolate(
            region, size=(r.out_height, r.out_width), mode="bilinear", antialias=True, align_corners=False
        )
        out.append(resized.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0))
    return torch.stack(out)


def _ints(column: Any) -> list[int]:
    return [int(v) for v in (column.tolist() if hasattr(column, "tolist") else column)]


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(
            f"decode_batch returns torch tensors ({exc}): pip install 'shardcache[torch]'"
        ) from exc
    return torch


def _has_torchvision() -> bool:
    try:
        import torchvision.io  # noqa: F401
    except Exception:  # an ImportError, or a torchvision built for another torch failing to register its ops
        return False
    return True
