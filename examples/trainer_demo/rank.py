"""One rank of the trainer demo: epochs of a small model over the full pipeline, reported to the coordinator.

Training stream (every epoch, through the daemon): tar shards -> `decode` -> `augment` (random crop and flip)
-> shuffle -> batches, in `--workers` DataLoader worker processes (`TorchLoader`). Validation stream: tar
shards -> `preprocess` (deterministic centre crop) -> Lance `.cache()` -> batches: the first epoch builds the
cache from shards the daemon serves, later epochs read it from local disk. The per-epoch augmentation stays
after the cache boundary, as in a real trainer; the training stream is not cached, so the daemon serves it
every epoch and its hit ratio is what the demo shows.
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardcache.context import RuntimeContext
from shardcache.daemon_access.telemetry import Telemetry
from shardcache.dataset import Dataset
from trainer_demo.data import CLASSES, IMAGE_SHAPE
from trainer_demo.stopping import become_group_leader, dump_stacks_on_sigusr1

CROP = 56
PROGRESS_EVERY_S = 0.5  # at most one progress message per this many seconds (the first step's at once)


@dataclass(frozen=True)
class RankConfig:
    """What one rank process needs (picklable: ranks are spawned)."""

    rank: int
    world_size: int
    train: tuple[str, ...]
    val: tuple[str, ...]
    socket: str | None
    lance_dir: str
    epochs: int
    workers: int
    batch_size: int
    seed: int
    job: str
    hang_after_samples: int | None = None  # test hook (--test-stall): each worker hangs after that many


@dataclass(frozen=True)
class EpochReport:
    """One rank's figures for one epoch."""

    rank: int
    epoch: int
    samples: int
    seconds: float
    waited_s: float  # time the training step waited for its next batch
    val_samples: int
    val_accuracy: float


def _image(sample: dict[str, Any]) -> np.ndarray:
    """The sample's image: its `.npy` member, else its largest binary member's bytes (a user's dataset)."""
    data = sample.get("npy")
    if isinstance(data, bytes):
        return np.asarray(np.load(io.BytesIO(data), allow_pickle=False), dtype=np.uint8)
    blobs = [v for k, v in sample.items() if isinstance(v, bytes) and not k.startswith("__")]
    raw = np.frombuffer(max(blobs, key=len), dtype=np.uint8) if blobs else np.zeros(0, np.uint8)
    flat = np.zeros(int(np.prod(IMAGE_SHAPE)), dtype=np.uint8)
    flat[: min(flat.size, raw.size)] = raw[: flat.size]
    return flat.reshape(IMAGE_SHAPE)


def _label(sample: dict[str, Any]) -> int:
    for key in ("json", "cls"):
        value = sample.get(key)
        if isinstance(value, bytes):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            label = parsed.get("label", 0) if isinstance(parsed, dict) else parsed
            return int(label) % CLASSES if isinstance(label, int) else 0
    return 0


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Tar members to an image array and an integer label."""
    return {"image": _image(sample), "label": _label(sample)}


def augment(sample: dict[str, Any]) -> dict[str, Any]:
    """A random crop and horizontal flip: different every epoch, so it must stay after `.cache()`."""
    rng = np.random.default_rng()
    image = sample["image"]
    top, left = rng.integers(0, image.shape[0] - CROP + 1), rng.integers(0, image.shape[1] - CROP + 1)
    crop = image[top : top + CROP, left : left + CROP]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return {"image": np.ascontiguousarray(crop), "label": sample["label"]}


def preprocess(sample: dict[str, Any]) -> dict[str, Any]:
    """Deterministic validation preprocessing (decode, centre crop): worth caching once per node."""
    image = _image(sample)
    top, left = (image.shape[0] - CROP) // 2, (image.shape[1] - CROP) // 2
    return {
        "image": np.ascontiguousarray(image[top : top + CROP, left : left + CROP]),
        "label": _label(sample),
    }


def collate(samples: list[dict[str, Any]]) -> tuple[Any, Any]:
    """A batch as (uint8 images NHWC, int64 labels)."""
    import torch

    images = torch.from_numpy(np.stack([s["image"] for s in samples]))
    return images, torch.tensor([s["label"] for s in samples], dtype=torch.int64)


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.AvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(3 * 7 * 7, CLASSES))


def _inputs(images: Any) -> Any:
    return images.permute(0, 3, 1, 2).float().div_(255.0)


class Progress:
    """The rank's progress messages to the coordinator: ("progress", rank, samples, steps, phase).

    `samples` since the last message (the progress bar), `steps` taken so far in all epochs, `phase`
    "training" or "validating". The coordinator's stall watch counts the time since the last message, so a
    step or validation batch sends one whenever `PROGRESS_EVERY_S` has passed since the previous one.
    """

    def __init__(self, events: Any, rank: int) -> None:
        self.events, self.rank = events, rank
        self.steps = self.samples = 0
        self.sent = float("-inf")

    def step(self, samples: int, phase: str = "training") -> None:
        if phase == "training":
            self.steps += 1
        self.samples += samples
        if time.monotonic() - self.sent >= PROGRESS_EVERY_S:
            self.flush(phase)

    def flush(self, phase: str) -> None:
        self.events.put(("progress", self.rank, self.samples, self.steps, phase))
        self.samples, self.sent = 0, time.monotonic()


class HangInWorkers:
    """The test hook `--test-stall`: a DataLoader worker blocks for good once it has produced `after` samples.

    As a worker deadlocked after its fork, it then neither produces batches nor checks that its rank is
    alive, and its rank waits for it forever. Each worker counts its own samples, over all epochs (the
    workers persist across epochs).
    """

    def __init__(self, rank: int, after: int) -> None:
        self.rank, self.after, self.produced = rank, after, 0

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self.produced >= self.after:
            print(f"test hook: a DataLoader worker of rank {self.rank} hangs", file=sys.stderr, flush=True)
            threading.Event().wait()
        self.produced += 1
        return sample


def run_rank(cfg: RankConfig, events: Any, barrier: Any) -> None:
    """Train `cfg.epochs` epochs; put progress (`Progress`) and ("epoch", report) on `events`.

    After each epoch the rank waits on `barrier` with the other ranks and the coordinator, which reads the
    daemon's counters there, so each epoch's figures are its own. The rank leads its own process group, which
    its DataLoader workers inherit: the coordinator stops it by killing the group (`trainer_demo.stopping`).
    """
    become_group_leader()  # first: before any worker exists
    dump_stacks_on_sigusr1()  # its DataLoader workers inherit it
    import torch

    from shardcache.loader.torch_loader import TorchLoader

    try:
        # The validation cache loads lance in this process; the DataLoader workers forked afterwards never
        # touch lance, so its fork warning does not apply to them.
        warnings.filterwarnings("ignore", "lance is not fork-safe", UserWarning)
        torch.set_num_threads(1)  # two ranks share a couple of cores with their workers and the daemon
        ctx = RuntimeContext(rank=cfg.rank, world_size=cfg.world_size, seed=cfg.seed)
        daemon = cfg.socket or "auto"
        train = Dataset.from_source("tars", list(cfg.train), context=ctx, daemon=daemon)
        train = train.map(decode).map(augment).shuffle(256)
        if cfg.hang_after_samples is not None:
            train = train.map(HangInWorkers(cfg.rank, cfg.hang_after_samples))
        # This process was spawned, so torch would spawn its workers too (a fresh interpreter importing torch,
        # seconds per worker per epoch); forked workers start at once.
        fork: dict[str, Any] = {"multiprocessing_context": "fork"} if cfg.workers else {}
        loader = TorchLoader(
            train, num_workers=cfg.workers, batch_size=cfg.batch_size, collate_fn=collate, **fork
        )
        val = None
        if cfg.val:
            val = Dataset.from_source("tars", list(cfg.val), context=ctx, daemon=daemon).map(preprocess)
            val = val.cache(cache_dir=cfg.lance_dir).batch(256, collate_fn=collate)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        progress = Progress(events, cfg.rank)
        progress.flush("training")  # started: the stall watch counts from here
        with Telemetry(job=cfg.job, slot=cfg.rank, socket=cfg.socket, interval_s=2.0) as telemetry:
            for epoch in range(cfg.epochs):
                loader.set_epoch(epoch)
                started, waited_before, samples = time.perf_counter(), telemetry.waited_s, 0
                for images, labels in telemetry.watch(loader):
                    optimizer.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(_inputs(images)), labels)
                    loss.backward()  # type: ignore[no-untyped-call]
                    optimizer.step()
                    samples += len(labels)
                    progress.step(len(labels))
                progress.flush("validating")
                seconds = time.perf_counter() - started
                val_samples, accuracy = _validate(model, val, ctx, progress) if val is not None else (0, 0.0)
                waited = telemetry.waited_s - waited_before
                events.put(
                    ("epoch", EpochReport(cfg.rank, epoch, samples, seconds, waited, val_samples, accuracy))
                )
                barrier.wait()
    except KeyboardInterrupt:
        return  # the coordinator reports the interruption and stops everything
    except BaseException as exc:
        events.put(("error", cfg.rank, f"{type(exc).__name__}: {exc}"))
        barrier.abort()
        raise


def _validate(model: Any, val: Dataset, ctx: RuntimeContext, progress: Progress) -> tuple[int, float]:
    import torch

    correct = total = 0
    with torch.no_grad():
        for images, labels in val.iter_context(ctx):
            correct += int((model(_inputs(images)).argmax(1) == labels).sum())
            total += len(labels)
            progress.step(0, "validating")
    return total, correct / max(1, total)
