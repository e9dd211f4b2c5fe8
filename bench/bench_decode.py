"""Image decode + random-resized-crop to 224x224 on one CPU core: images/s per backend, as ratios to the
plain Pillow pipeline measured in the same run; and the bytes per sample a DataLoader worker ships.

The images are synthesized once per size (a smooth gradient plus noise, JPEG quality 90): ImageNet-like
500x375 and web-like 1024x768. Every method decodes the same images with the same crop boxes (torchvision's
RandomResizedCrop parameters, drawn per image from (seed, round, key)); rounds interleave the methods, each
round starting with the next method, and the median round counts. Rates are per CPU-second of this
process, pinned to one core (the development machine's 2 cores are shared, so wall-clock rates swing with
other jobs' load).

- reference: the plain Pillow pipeline written out here (open, convert to RGB, crop, bilinear resize):
  what torchvision's `RandomResizedCrop` does to a PIL image. torchvision itself is not used: no
  torchvision wheel loads against this environment's CPU build of torch (its operators fail to register).
- pil: `shardcache.images.decode(backend="pil")`, the same work through the stage (its overhead).
- pil+draft: the same with Pillow's `Image.draft` DCT scaling.
- turbo: libjpeg-turbo (simplejpeg) with DCT-domain downscaling where the crop allows it.
- turbo, no DCT: the same without the downscaling (the scaling's own share of the gain).
- Pillow / turbo decode only: the whole image at full size, no crop or resize: what the decode alone costs
  (the rest of a row above is the crop and Pillow's resize, the same work on every backend).

IPC: the bytes one sample costs to ship from a worker: pickled alone (the decoded 224x224x3 array against
the deferred record, compressed bytes + crop box), and as a DataLoader worker ships a collated batch (what
torch's ForkingPickler writes to the queue's pipe plus the shared memory its tensors are moved to).

    .venv/bin/python -m bench.bench_decode                       # 32 images per size, 5 rounds
    .venv/bin/python -m bench.bench_decode --images 8 --rounds 2 # quick
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import statistics
import time
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import PIL
from PIL import Image

from shardcache import images
from shardcache.images import codecs
from shardcache.images.crop import random_resized_box, sample_rng

SIZES = {"500x375": (500, 375), "1024x768": (1024, 768)}
OUT = 224


def picture(width: int, height: int, seed: int) -> bytes:
    """A JPEG (quality 90) of a smooth gradient with noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 255 / (width + height)], axis=-1)
    noise = np.random.default_rng(seed).normal(0, 6, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.asarray((base + noise).clip(0, 255), dtype=np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def reference(data: bytes, seed: int, key: str) -> np.ndarray:
    """The plain Pillow pipeline: decode the whole image, crop, resize (bilinear), to an array."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = random_resized_box(image.width, image.height, sample_rng(seed, key))
    region = image.crop((box.left, box.top, box.left + box.width, box.top + box.height))
    return np.array(region.resize((OUT, OUT), Image.Resampling.BILINEAR))


def stage(backend: str, draft: bool = False) -> Callable[[bytes, int, str], np.ndarray]:
    decoders: dict[int, images.ImageDecode] = {}

    def run(data: bytes, seed: int, key: str) -> np.ndarray:
        decoder = decoders.get(seed) or decoders.setdefault(
            seed, images.decode("jpg", OUT, backend=backend, seed=seed, draft=draft)
        )
        out: np.ndarray = decoder({"__key__": key, "jpg": data})["jpg"]
        return out

    return run


def without_dct(run: Callable[[bytes, int, str], np.ndarray]) -> Callable[[bytes, int, str], np.ndarray]:
    def wrapped(data: bytes, seed: int, key: str) -> np.ndarray:
        saved = codecs.dct_factor
        codecs.dct_factor = lambda box, size: 1  # type: ignore[assignment]
        try:
            return run(data, seed, key)
        finally:
            codecs.dct_factor = saved

    return wrapped


def pillow_decode_only(data: bytes, seed: int, key: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def turbo_decode_only(data: bytes, seed: int, key: str) -> np.ndarray:
    out: np.ndarray = codecs.turbo().decode_jpeg(data, colorspace="RGB")
    return out


def methods() -> dict[str, Callable[[bytes, int, str], np.ndarray]]:
    return {
        "reference (Pillow)": reference,
        "pil": stage("pil"),
        "pil+draft": stage("pil", draft=True),
        "turbo": stage("turbo"),
        "turbo, no DCT": without_dct(stage("turbo")),
        # Not crops: the whole image decoded at full size, no resize (where the time of the rows above goes).
        "Pillow decode only": pillow_decode_only,
        "turbo decode only": turbo_decode_only,
    }


def measure(datas: list[bytes], rounds: int) -> dict[str, float]:
    """Median images per CPU-second of each method over `rounds` interleaved rounds (CPU time: other jobs
    waiting for the same core do not count against a method, as they would in wall-clock time)."""
    runs = methods()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        # Each round starts with another method: in a fixed order, the same work (the reference and the
        # `pil` backend) measured up to 20% apart here.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = runs[name]
            started = time.process_time()
            for i, data in enumerate(datas):
                run(data, r, f"img_{i:05d}")
            rates[name].append(len(datas) / (time.process_time() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


def ipc_bytes(datas: list[bytes]) -> tuple[float, float, float]:
    """Mean pickled bytes per sample: decoded array, deferred record; and the mean JPEG size."""
    eager = images.decode("jpg", OUT, seed=0)
    deferred = images.decode("jpg", OUT, seed=0, defer=True)
    decoded = [len(pickle.dumps(eager({"__key__": str(i), "jpg": d})["jpg"], 5)) for i, d in enumerate(datas)]
    records = [
        len(pickle.dumps(deferred({"__key__": str(i), "jpg": d})["jpg"], 5)) for i, d in enumerate(datas)
    ]
    return statistics.mean(decoded), statistics.mean(records), statistics.mean(len(d) for d in datas)


def queue_bytes(datas: list[bytes], batch: int = 32) -> tuple[float, float]:
    """Bytes per sample a DataLoader worker ships for one collated batch, eager against deferred: what
    torch's ForkingPickler writes to the worker queue's pipe plus the shared memory its tensors move to."""
    import torch
    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions, as DataLoader workers do)
    from torch.utils.data import default_collate

    def shipped(collated: Any) -> int:
        pipe = len(ForkingPickler.dumps(collated))
        tensors = [v for v in collated.values() if isinstance(v, torch.Tensor)]
        tensors += [v for v in collated["jpg"] if isinstance(v, torch.Tensor)] if not tensors else []
        return pipe + sum(t.untyped_storage().nbytes() for t in tensors)

    # Distinct images only: pickle writes a repeated bytes object once.
    batch = min(batch, len(datas))
    samples = [{"__key__": f"{i:05d}", "jpg": d} for i, d in enumerate(datas[:batch])]
    eager = default_collate([images.decode("jpg", OUT, seed=0)(s) for s in samples])
    deferred = default_collate([images.decode("jpg", OUT, seed=0, defer=True)(s) for s in samples])
    return shipped(eager) / batch, shipped(deferred) / batch


def pin_one_core() -> int:
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=32, help="distinct images per size")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    core = pin_one_core()
    print(f"one core (cpu {core}), {args.images} images per size, {args.rounds} rounds, crop to {OUT}x{OUT}")
    print(f"Pillow {PIL.__version__}, simplejpeg {codecs.turbo().__version__}")
    for label, (width, height) in SIZES.items():
        datas = [picture(width, height, seed) for seed in range(args.images)]
        # The stage's Pillow backend is the reference's work exactly: same crop, same pixels.
        assert np.array_equal(reference(datas[0], 0, "k"), stage("pil")(datas[0], 0, "k"))
        rates = measure(datas, args.rounds)
        base = rates["reference (Pillow)"]
        print(f"\n{label} JPEG (mean {statistics.mean(len(d) for d in datas) / 1024:.1f} KiB)")
        print(f"  {'method':<20}{'images/CPU-s':>13}{'ratio':>8}")
        for name, rate in rates.items():
            print(f"  {name:<20}{rate:>13.1f}{rate / base:>7.2f}x")
        decoded, record, jpeg = ipc_bytes(datas)
        print(
            f"  IPC bytes per sample: decoded {decoded:,.0f} B, deferred record {record:,.0f} B "
            f"(JPEG {jpeg:,.0f} B): decoded / deferred {decoded / record:.2f}x"
        )
        eager_q, deferred_q = queue_bytes(datas)
        print(
            f"  through a DataLoader queue (collated batches, pipe + shared memory): decoded "
            f"{eager_q:,.0f} B, deferred {deferred_q:,.0f} B per sample: {eager_q / deferred_q:.2f}x"
        )


if __name__ == "__main__":
    main()
