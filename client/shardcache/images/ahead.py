"""`decode_ahead`: decode the deferred images of the next batches while the training step runs.

The main process iterates the loader (so DataLoader workers are still forked from the main thread), and one
background thread decodes each batch's `DeferredImage` field with `decode_batch`, up to `depth` batches ahead
of the one the step is using:

- on the CPU, in parallel with the step: libjpeg-turbo and Pillow release the GIL while they decode;
- on a GPU (**design; not yet run on a GPU**): on a CUDA stream of its own, so the decode overlaps the step's
  kernels instead of running in series with them; the consumer's stream waits on an event recorded after
  the decode, and the tensor is marked as used by that stream (`record_stream`) so its memory is not reused
  early.

The decode thread works inside `shardcache.forksafe.background_work()`: a DataLoader forking its workers
waits until the batch in hand is decoded, so no child starts with a decoder's lock held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias

from shardcache.errors import ConfigError, positive_int
from shardcache.forksafe import background_work
from shardcache.images.deferred import DeferredImage, decode_batch, resolve_device

if TYPE_CHECKING:
    import torch

Images = DeferredImage | Sequence[DeferredImage]  # one batch's field, as torch's collate leaves it
# A batch's images decoded, and on a GPU the event that marks the end of their decode (None on the CPU).
Decoded: TypeAlias = "tuple[torch.Tensor, torch.cuda.Event | None]"
Decode = Callable[[Images], Decoded]


def decode_ahead(
    batches: Iterable[dict[str, Any]],
    field: str,
    *,
    depth: int = 2,
    device: str = "auto",
    backend: str = "auto",
) -> Iterator[dict[str, Any]]:
    """Yield each batch with `batch[field]` (collated `DeferredImage`s) decoded into a (batch, height, width,
    3) uint8 tensor on `device`, decoding up to `depth` batches ahead in a background thread.

    Example:
        >>> loader = TorchLoader(ds.map(images.decode("jpg", defer=True)), num_workers=8, batch_size=256)
        >>> for batch in images.decode_ahead(loader, "jpg", device="auto"):  # doctest: +SKIP
        ...     train_step(batch["jpg"])
    """
    positive_int("depth", depth, " (batches decoded ahead of the step)")
    where = resolve_device(device)
    decode = _gpu_decoder(where, backend) if where != "cpu" else _cpu_decoder(backend)
    pending: deque[tuple[Mapping[str, object], Future[Decoded]]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="shardcache-decode") as pool:
        try:
            for batch in batches:
                if not isinstance(batch, dict) or field not in batch:
                    raise ConfigError(
                        f"decode_ahead({field!r}): expected batches that are dicts with a {field!r} field "
                        f"(torch's default collate of samples), got {type(batch).__name__}"
                    )
                pending.append((batch, pool.submit(decode, batch[field])))
                if len(pending) > depth:
                    yield _ready(*pending.popleft(), field, where)
            while pending:
                yield _ready(*pending.popleft(), field, where)
        finally:
            for _, future in pending:
                future.cancel()


def _cpu_decoder(backend: str) -> Decode:
    def decode(images: Images) -> tuple[torch.Tensor, None]:
        with background_work():
            return decode_batch(images, device="cpu", backend=backend), None

    return decode


def _gpu_decoder(device: str, backend: str) -> Decode:
    """Decode on a stream of its own and record an event after it. UNTESTED ON A GPU (see the module)."""
    import torch

    stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

    def decode(images: Images) -> Decoded:
        with background_work(), torch.cuda.stream(stream):
            tensor = decode_batch(images, device=device, backend=backend)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return tensor, event

    return decode


def _ready(
    batch: Mapping[str, object],
    future: Future[Decoded],
    field: str,
    device: str,
) -> dict[str, object]:
    tensor, event = future.result()
    if event is not None:  # the GPU path: the step's stream waits for the decode's, not the host
        import torch

        current = torch.cuda.current_stream(device)
        current.wait_event(event)
        tensor.record_stream(current)
    out = dict(batch)
    out[field] = tensor
    return out
