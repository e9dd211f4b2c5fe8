"""`TorchLoader.balance(...)`: the same number of items on every data-parallel rank, with exact resume.

A loader-side stage (main process, after the workers are merged), for materialised packs or batches. It
works chunk by chunk: every rank fills a local buffer from upstream (at least `buffer_size` items, unless
its upstream has ended), the ranks exchange their counts (one `all_gather_object`), and each computes the
same plan (`plan_chunk`): up to `chunk_size` steps in which every rank yields one item, its own when it has
one, else one sent by the rank with the most to spare (preferring its own node under topology="node"; at
most `max_transfer_per_round` sent by one rank per chunk, except in a chunk of one step that needs more:
see `plan_chunk`). A rank sends only what it holds beyond the item
it yields itself in that step, so a plan never asks a rank for more items than it buffered: the ranks carry
the plan out without checking, and one popping an empty buffer would leave the others waiting for it
forever. Items move point to point (`send_object_list` over `process_group`, in the plan's order, so no
two ranks wait on each other). Tensors on an accelerator travel through host memory and are restored on the
receiving rank's current device of the same type (CUDA device indices are not kept); `device_process_group`
is accepted for mvp-dataset compatibility and not used.
At the end, when fewer items are left than ranks, `drop_last=True` drops them on every rank at once;
`drop_last=False` yields the rest and gives the ranks without an item `dummy_factory(context)` (a batch
the training step masks out).

Without torch.distributed initialised, or with one rank, the stage passes items through.

Resume is exact, which mvp-dataset 0.2.3's balance() is not. The state is the chunk number, the items
already yielded from it, and the upstream position where the chunk's buffer began (each buffered item
remembers the upstream state after it, so no sample data is saved). A resume restores that upstream
position, redoes the chunk's fill, count exchange, plan and transfers (all deterministic), and skips the
items already yielded. Every rank must therefore resume from states taken at the same step, as a
data-parallel checkpoint does; a rank resuming another chunk than the others raises ResumeStateError.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal, TypedDict

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, ResumeStateError
from shardcache.formatting import callable_name
from shardcache.node import Node, State, state_of
from shardcache.stages.traits import StageTraits

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

Topology = Literal["node", "none"]


@dataclass(frozen=True)
class Status:
    """One rank's counts for a chunk, gathered by every rank."""

    rank: int
    node: int
    available: int
    done: bool
    chunk: int


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    count: int


@dataclass
class ChunkPlan:
    """Per rank: items taken locally, dummies; transfers in order; whether the stream ends after it."""

    local: dict[int, int]
    dummies: dict[int, int]
    transfers: list[Transfer] = field(default_factory=list)
    finished: bool = False

    def steps(self, rank: int) -> int:
        received = sum(t.count for t in self.transfers if t.dst == rank)
        return self.local[rank] + received + self.dummies[rank]


def plan_chunk(
    statuses: Sequence[Status], chunk_size: int, max_transfer: int, drop_last: bool, topology: Topology
) -> ChunkPlan:
    """The same plan on every rank: up to `chunk_size` steps of one item per rank (a pure function).

    In a step, every rank with an item left keeps one; each rank without one gets one from a donor with an
    item to spare beyond the one it keeps (same node first under topology="node", then the most to spare,
    then the lowest rank) and transfer budget left. Setting the kept item aside before choosing donors is
    what keeps a plan within every rank's count. A step that cannot be completed within the budget ends the
    chunk before it; the next chunk has a fresh budget.

    A chunk always makes progress. When even its first step cannot be completed within the budget (at the
    end of an epoch on a large world: one rank holds items and more ranks are empty than the budget serves),
    that step goes over it: donors with budget left give first, as in any step, then the others by the same
    order, and the chunk holds just that step. The budget bounds a round's traffic, but a step it can never
    admit would stop the stream (it used to be a ConfigError, so a 16-rank job with the default budget
    failed at the end of an epoch); such a chunk moves only the items its one step needs. A step can always
    be completed this way: it is built only with an item per rank left, so the items beyond the one each
    holder keeps cover every empty rank. Every plan the budget admits is unchanged.

    Raises:
        ConfigError: `max_transfer` is below 1.
    """
    if max_transfer < 1:
        raise ConfigError(f"balance(max_transfer_per_round={max_transfer}): expected a positive integer")
    ranks = sorted(s.rank for s in statuses)
    by_rank = {s.rank: s for s in statuses}
    left = {r: by_rank[r].available for r in ranks}
    plan = ChunkPlan({r: 0 for r in ranks}, {r: 0 for r in ranks})
    sent = {r: 0 for r in ranks}
    all_done = all(s.done for s in statuses)
    for step in range(chunk_size):
        total = sum(left.values())
        if total == 0 or (total < len(ranks) and drop_last):
            plan.finished = all_done
            break
        if total < len(ranks):  # the tail, with dummies: no transfers, every real item is yielded
            for r in ranks:
                if left[r]:
                    plan.local[r] += 1
                    left[r] -= 1
                else:
                    plan.dummies[r] += 1
            if not any(left.values()):
                plan.finished = all_done
                break
            continue
        # Each rank holding an item keeps one for this step before donors are chosen: only the rest is spare.
        needy = [r for r in ranks if not left[r]]
        spare = {r: left[r] - 1 for r in ranks if left[r]}
        budget = {r: max_transfer - sent[r] for r in spare}
        moves: list[tuple[int, int]] = []
        over_budget = False
        for dst in needy:
            donors = [r for r in spare if spare[r] and budget[r] > 0]
            if not donors and step == 0:  # a chunk's first step may go over (see above)
                donors = [r for r in spare if spare[r]]
                over_budget = True
            if not donors:
                break
            near = by_rank[dst].node
            src = min(donors, key=lambda r: (topology == "node" and by_rank[r].node != near, -spare[r], r))
            moves.append((src, dst))
            spare[src] -= 1
            budget[src] -= 1
        if len(moves) < len(needy):  # out of transfer budget: end the chunk before this step
            break
        for r in spare:
            plan.local[r] += 1
            left[r] -= 1
        for src, dst in moves:
            left[src] -= 1
            sent[src] += 1
            last = plan.transfers[-1] if plan.transfers else None
            if last is not None and (last.src, last.dst) == (src, dst):
                plan.transfers[-1] = Transfer(src, dst, last.count + 1)
            else:
                plan.transfers.append(Transfer(src, dst, 1))
        if over_budget:  # a step over the budget is the whole chunk
            break
    return plan


@dataclass(frozen=True)
class BalanceStage(StageTraits):
    """Equal item counts per data-parallel rank (see the module); `process_group` None: the default group."""

    drop_last: bool = True
    dummy_factory: Callable[[RuntimeContext], object] | None = None
    buffer_size: int = 32
    chunk_size: int = 16
    max_transfer_per_round: int = 8
    topology: Topology = "node"
    process_group: ProcessGroup | None = None
    device_process_group: ProcessGroup | None = None
    kind: ClassVar[str] = "balance"
    described_args: ClassVar[tuple[str, ...]] = (
        "drop_last",
        "dummy_factory",
        "buffer_size",
        "chunk_size",
        "max_transfer_per_round",
        "topology",
    )

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return BalanceNode(up, self, ctx)

    def describe(self) -> str:

        dummy = None if self.dummy_factory is None else callable_name(self.dummy_factory)
        return (
            f"balance({self.drop_last},{dummy},{self.buffer_size},{self.chunk_size},"
            f"{self.max_transfer_per_round},{self.topology})"
        )


def _dist() -> ModuleType | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a TorchLoader requirement
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


@dataclass(frozen=True)
class _OnDevice:
    """A tensor moved to host memory for a transfer, and the device type it came from."""

    tensor: torch.Tensor
    device_type: str


def _to_host(item: object) -> object:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor) and item.device.type != "cpu":
        return _OnDevice(item.cpu(), item.device.type)
    if isinstance(item, dict):
        return {k: _to_host(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)) and type(item) in (list, tuple):
        return type(item)(_to_host(v) for v in item)
    return item


def _from_host(item: object) -> object:
    if isinstance(item, _OnDevice):
        import torch

        kind = item.device_type
        module = getattr(torch, kind, None)
        index = module.current_device() if module is not None and hasattr(module, "current_device") else None
        return item.tensor.to(torch.device(kind, index) if index is not None else torch.device(kind))
    if isinstance(item, dict):
        return {k: _from_host(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)) and type(item) in (list, tuple):
        return type(item)(_from_host(v) for v in item)
    return item


class BalancePassthroughState(TypedDict):
    """A balance stage's state when it passed items through (no torch.distributed): its upstream's."""

    passthrough: bool  # True
    up: State


class BalanceChunkState(TypedDict):
    """A balance stage's state: the chunk it is in, the items of it emitted, and the upstream state where
    the chunk began."""

    chunk: int
    offset: int
    up: State


BalanceState = BalancePassthroughState | BalanceChunkState


class BalanceNode(Node):
    def __init__(self, up: Node, spec: BalanceStage, ctx: RuntimeContext) -> None:
        super().__init__()
        self.up = up
        self.spec = spec
        self.ctx = ctx
        self.chunk = 0  # the chunk being yielded
        self.offset = 0  # items of it already yielded
        self.output: list[object] = []
        self.finished = False
        self.buffer: deque[tuple[object, State]] = deque()  # (item, upstream state after it)
        self.front: State | None = None  # upstream state where the buffer begins
        self.chunk_front: State | None = None  # ... when the current chunk began
        self.upstream_done = False
        self._skip = 0
        self._passthrough: bool | None = None
        self._loaded: BalanceState | None = None

    def _active(self) -> ModuleType | None:
        dist = _dist()
        if dist is None or dist.get_world_size(self.spec.process_group) == 1:
            return None
        return dist

    def gen(self) -> Iterator[object]:
        dist = self._active()
        self._passthrough = dist is None
        if dist is None:
            yield from self.up.iterator()
            return
        up = self.up.iterator()
        if self.front is None:
            self.front = self.up.state_dict()
        while not self.finished:
            self._build_chunk(dist, up)
            while self.offset < len(self.output):
                item = self.output[self.offset]
                self.offset += 1
                if self._skip:
                    self._skip -= 1
                    continue
                yield item
            if self.finished:
                return
            self.chunk += 1
            self.offset = 0
            self.output = []

    def _fill(self, up: Iterator[object], target: int) -> None:
        while len(self.buffer) < target and not self.upstream_done:
            try:
                item = next(up)
            except StopIteration:
                self.upstream_done = True
                return
            self.buffer.append((item, self.up.state_dict()))

    def _pop(self) -> object:
        item, self.front = self.buffer.popleft()
        return item

    def _build_chunk(self, dist: ModuleType, up: Iterator[object]) -> None:
        spec, group = self.spec, self.spec.process_group
        self.chunk_front = self.front
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self._fill(up, max(spec.buffer_size, world))
        mine = Status(rank, self.ctx.node, len(self.buffer), self.upstream_done, self.chunk)
        gathered: list[Status] = [mine] * world  # placeholders: all_gather_object sets every one
        dist.all_gather_object(gathered, mine, group=group)
        chunks = {s.chunk for s in gathered}
        if len(chunks) > 1:
            raise ResumeStateError(
                f"balance(): the ranks are at different chunks {sorted(chunks)}; resume every rank from "
                "states taken at the same step"
            )
        plan = plan_chunk(
            gathered, spec.chunk_size, spec.max_transfer_per_round, spec.drop_last, spec.topology
        )
        output = [self._pop() for _ in range(plan.local[rank])]
        global_rank = dist.get_global_rank if group is not None else (lambda _g, r: r)
        for transfer in plan.transfers:
            if transfer.src == rank:
                payload = [[_to_host(self._pop()) for _ in range(transfer.count)]]
                dist.send_object_list(payload, dst=global_rank(group, transfer.dst), group=group)
            elif transfer.dst == rank:
                box: list[list[object]] = [[]]  # a placeholder: recv_object_list sets it
                dist.recv_object_list(box, src=global_rank(group, transfer.src), group=group)
                output.extend(_from_host(item) for item in box[0])
        if plan.dummies[rank]:
            if spec.dummy_factory is None:  # pragma: no cover - refused when the stage is built
                raise ConfigError("balance(drop_last=False) needs dummy_factory")
            output.extend(spec.dummy_factory(self.ctx) for _ in range(plan.dummies[rank]))
        self.output = output
        self.finished = plan.finished or (plan.steps(rank) == 0)

    def state_dict(self) -> BalanceState:
        if self._it is None and self._loaded is not None:
            return self._loaded
        if self._passthrough is None and self._active() is None or self._passthrough:
            return {"passthrough": True, "up": self.up.state_dict()}
        if self.front is None:  # not started
            return {"chunk": self.chunk, "offset": self.offset, "up": self.up.state_dict()}
        if self.offset >= len(self.output) and not self.finished:
            return {"chunk": self.chunk + 1, "offset": 0, "up": self.front}
        assert self.chunk_front is not None, "the first chunk is built before the first item"
        return {"chunk": self.chunk, "offset": self.offset, "up": self.chunk_front}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        up = state_of(state, "up")
        if state.get("passthrough"):
            self._loaded = {"passthrough": True, "up": up}
            if self._active() is not None:
                raise ResumeStateError(
                    "balance(): the state was taken without torch.distributed (items passed through); "
                    "resume it the same way"
                )
            self.up.load_state_dict(up)
            return
        chunk, offset = state.get("chunk"), state.get("offset")
        if not isinstance(chunk, int) or not isinstance(offset, int) or chunk < 0 or offset < 0:
            raise ResumeStateError(f"balance() state has chunk={chunk!r}, offset={offset!r}; it is truncated")
        self._loaded = {"chunk": chunk, "offset": offset, "up": up}
        self.up.load_state_dict(up)
        self.front = up
        self.chunk, self._skip = chunk, offset

    def close(self) -> None:
        super().close()
        self.up.close()
