"""The stage builders shared by `Dataset` and `TorchLoader`: arguments are checked once, here.

Each builder validates its arguments and returns the frozen stage spec; a bad value raises ConfigError
(a ValueError) naming the argument and what is accepted, whichever facade the stage was added on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, positive_int
from shardcache.stages.assemble import Assembler, AssembleStage
from shardcache.stages.balance import BalanceStage
from shardcache.stages.batch import BatchStage
from shardcache.stages.map import MapStage
from shardcache.stages.select import SelectStage
from shardcache.stages.shuffle import ShuffleStage
from shardcache.stages.unbatch import UnbatchStage

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


F = TypeVar("F")


def a_callable(name: str, value: F) -> F:
    """`value` if it is callable, else ConfigError naming `name`."""
    if not callable(value):
        raise ConfigError(f"{name}={value!r}: expected a callable")
    return value


def map_stage(fn: Callable[[Any], object]) -> MapStage:
    return MapStage(a_callable("fn", fn))


def select_stage(fields: str | Sequence[str]) -> SelectStage:
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    if not names or not all(isinstance(f, str) for f in names):
        raise ConfigError(f"fields={fields!r}: expected a field name or a non-empty list of names")
    return SelectStage(names)


def shuffle_stage(buffer_size: int, initial: int | None = None, seed: int | None = None) -> ShuffleStage:
    positive_int("buffer_size", buffer_size)
    if initial is not None:
        positive_int("initial", initial)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed={seed!r}: expected an int or None")
    return ShuffleStage(buffer_size, initial, seed)


def assemble_stage(factory: Callable[[RuntimeContext], Assembler], drop_last: bool = False) -> AssembleStage:
    return AssembleStage(a_callable("factory", factory), bool(drop_last))


def batch_stage(
    batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[Any]], object] | None = None
) -> BatchStage:
    positive_int("batch_size", batch_size)
    if collate_fn is not None:
        a_callable("collate_fn", collate_fn)
    return BatchStage(batch_size, bool(drop_last), collate_fn)


def unbatch_stage() -> UnbatchStage:
    return UnbatchStage()


def balance_stage(
    drop_last: bool = True,
    dummy_factory: Callable[[RuntimeContext], object] | None = None,
    buffer_size: int = 32,
    chunk_size: int = 16,
    max_transfer_per_round: int = 16,
    topology: str = "node",
    process_group: ProcessGroup | None = None,
    device_process_group: ProcessGroup | None = None,
) -> BalanceStage:
    if not drop_last and dummy_factory is None:
        raise ConfigError(
            "balance(drop_last=False) needs dummy_factory: a function of the RuntimeContext returning an "
            "item the training step can mask out"
        )
    if dummy_factory is not None:
        a_callable("dummy_factory", dummy_factory)
    positive_int("buffer_size", buffer_size)
    positive_int("chunk_size", chunk_size)
    positive_int("max_transfer_per_round", max_transfer_per_round)
    if buffer_size < chunk_size:
        raise ConfigError(
            f"balance(buffer_size={buffer_size}, chunk_size={chunk_size}): buffer_size must be >= chunk_size"
        )
    if topology not in ("node", "none"):
        raise ConfigError(f"topology={topology!r}: expected 'node' or 'none'")
    return BalanceStage(
        bool(drop_last),
        dummy_factory,
        buffer_size,
        chunk_size,
        max_transfer_per_round,
        "node" if topology == "node" else "none",
        process_group,
        device_process_group,
    )
