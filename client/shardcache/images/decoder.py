"""`ImageDecode`: the per-sample stage that decodes one image field, fused with its crop.

Two ways into a pipeline:

- `ds.map(decoder)`: the crop of a sample comes from (seed, `__key__`): the same every epoch.
- `ds.assemble(decoder.each_epoch)`: the crop comes from (seed, epoch, `__key__`), the epoch and (when the
  decoder has no seed) the seed taken from the reader's `RuntimeContext`, so the augmentation changes every
  epoch and stays the same across workers and resumes. Here `on_error="skip"` drops a sample whose image
  does not decode (logged, counted in `skipped`). The assembler keeps no state, so a resume re-reads at
  most the assemble stage's checkpoint interval of samples.

`defer=True` reads only the header: the field becomes a `DeferredImage` (the compressed bytes and the crop
box) for `shardcache.images.decode_batch` to decode a whole batch later, in the main process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, CorruptImageError
from shardcache.images.codecs import BACKENDS, BadImage, decode_box, preload, read_header
from shardcache.images.crop import CROPS, crop_box, sample_rng
from shardcache.images.deferred import DeferredImage

logger = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class ImageDecode:
    """Decode `sample[key]` (JPEG, PNG, WebP bytes) into an RGB `size` crop: a (height, width, 3) uint8
    numpy array (HWC; torch's default collate stacks them into a (batch, height, width, 3) uint8 tensor).

    Build it with `shardcache.images.decode(...)`, which documents the arguments.
    """

    key: str = "jpg"
    size: tuple[int, int] = (224, 224)
    crop: str = "random_resized"
    backend: str = "auto"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    seed: int | None = None
    defer: bool = False
    draft: bool = False
    on_error: str = "raise"
    use_turbo: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: expected one of {BACKENDS}")
        if self.crop not in CROPS:
            raise ConfigError(f"crop={self.crop!r}: expected one of {CROPS}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error={self.on_error!r}: expected one of {ON_ERROR}")
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"size={self.size!r}: expected a positive int or (height, width)")
        if not (0 < self.scale[0] <= self.scale[1]) or not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(
                f"scale={self.scale!r}, ratio={self.ratio!r}: expected (low, high) with 0 < low <= high"
            )
        # Import the codecs now, in the process that builds the pipeline: forked DataLoader workers then
        # inherit them instead of importing lazily (shardcache.forksafe, rule 1).
        object.__setattr__(self, "use_turbo", preload(self.backend))

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The decoded sample, for `.map(decoder)`: crops from (seed or 0, `__key__`)."""
        return self.apply(sample, self.seed if self.seed is not None else 0, 0)

    def each_epoch(self, context: RuntimeContext) -> EpochDecoder:
        """An assembler for `.assemble(decoder.each_epoch)`: crops from (seed, epoch, `__key__`)."""
        return EpochDecoder(self, self.seed if self.seed is not None else context.seed, context.epoch)

    def apply(self, sample: dict[str, Any], seed: int, epoch: int) -> dict[str, Any]:
        """`sample` with its `key` field decoded (or deferred), the crop drawn from (seed, epoch, key)."""
        try:
            data = sample[self.key]
        except KeyError:
            fields = sorted(k for k in sample if not k.startswith("__"))
            raise ConfigError(
                f"images.decode(key={self.key!r}): sample {sample.get('__key__')!r} has no field "
                f"{self.key!r} (its fields: {fields})"
            ) from None
        name = sample.get("__key__")
        if self.crop == "random_resized" and name is None:
            raise ConfigError(
                "images.decode: a random crop is drawn from the sample's __key__, and this sample has none"
            )
        rng = sample_rng(seed, str(name), epoch) if self.crop == "random_resized" else None
        try:
            header = read_header(bytes(data), self.use_turbo)
            box = crop_box(self.crop, header.width, header.height, self.size, rng, self.scale, self.ratio)
            value: DeferredImage | npt.NDArray[np.uint8]
            if self.defer:
                value = DeferredImage(bytes(data), *box, *self.size, str(name))
            else:
                value = decode_box(bytes(data), header, box, self.size, self.draft).image
        except BadImage as exc:
            raise CorruptImageError.of(
                str(sample.get("__shard__", "?")), str(name), self.key, str(exc)
            ) from exc
        out = dict(sample)
        out[self.key] = value
        return out


class EpochDecoder:
    """The assembler `ImageDecode.each_epoch` makes for one reader and epoch (stateless, resumable)."""

    def __init__(self, decoder: ImageDecode, seed: int, epoch: int) -> None:
        self.decoder, self.seed, self.epoch = decoder, seed, epoch
        self.skipped = 0

    def push(self, sample: dict[str, Any]) -> Iterable[dict[str, Any]]:
        try:
            return (self.decoder.apply(sample, self.seed, self.epoch),)
        except CorruptImageError as exc:
            if self.decoder.on_error != "skip":
                raise
            self.skipped += 1
            logger.warning("skipping a sample whose image does not decode: %s (%d so far)", exc, self.skipped)
            return ()

    def finish(self, *, drop_last: bool = False) -> Iterator[dict[str, Any]]:
        return iter(())

    # No state: what was emitted is a function of the inputs, so the assemble stage checkpoints often.
    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: object) -> None:
        pass
