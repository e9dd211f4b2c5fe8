"""The balance planner (`shardcache.stages.balance.plan_chunk`) on its own: what one chunk's plan promises.

A plan tells every rank how many of its buffered items to keep, how many to send (and to whom) and how many
dummies to add. The ranks execute it blindly: a rank told to use more items than it holds pops an empty
buffer and fails while the others wait for it forever. So every property is checked over generated counts,
node layouts, topologies, transfer budgets and chunk sizes, for one chunk and for whole streams run chunk
by chunk the way `BalanceNode` runs them (fill, gather the counts, plan, pop, send).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from shardcache.errors import ConfigError
from shardcache.stages.balance import BalanceStage, ChunkPlan, Status, Topology, Transfer, plan_chunk
from shardcache.stages.builders import balance_stage

TOPOLOGIES: tuple[Topology, ...] = get_args(Topology)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
STREAM_SETTINGS = settings(SETTINGS, max_examples=100)
DEFAULTS = BalanceStage()

Item = tuple[int, int]  # (the rank whose upstream produced it, its index there)
DUMMY = (-1, -1)


# -- one chunk ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """The planner's input: every rank's buffered count, node and end of stream, and the stage's options."""

    counts: tuple[int, ...]
    nodes: tuple[int, ...]
    done: tuple[bool, ...]
    chunk_size: int
    max_transfer: int
    drop_last: bool
    topology: Topology

    @property
    def ranks(self) -> range:
        return range(len(self.counts))

    def plan(self) -> ChunkPlan:
        statuses = [Status(r, self.nodes[r], self.counts[r], self.done[r], 0) for r in self.ranks]
        return plan_chunk(statuses, self.chunk_size, self.max_transfer, self.drop_last, self.topology)


def sent(plan: ChunkPlan, rank: int) -> int:
    return sum(t.count for t in plan.transfers if t.src == rank)


def received(plan: ChunkPlan, rank: int) -> int:
    return sum(t.count for t in plan.transfers if t.dst == rank)


def drawn(plan: ChunkPlan, rank: int) -> int:
    """The rank's own items the plan uses: those it keeps and those it sends."""
    return plan.local[rank] + sent(plan, rank)


def node_layouts(world: int) -> st.SearchStrategy[tuple[int, ...]]:
    """torchrun's contiguous blocks of ranks per node, or any assignment of ranks to nodes."""
    blocks = st.integers(1, world).map(lambda per_node: tuple(r // per_node for r in range(world)))
    anyhow = st.lists(st.integers(0, 3), min_size=world, max_size=world).map(tuple)
    return st.one_of(blocks, anyhow)


def item_counts(world: int, most: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Skewed counts: empty ranks, ranks with one or two items, and full ones."""
    count = st.one_of(st.just(0), st.integers(1, 3), st.integers(0, most))
    return st.lists(count, min_size=world, max_size=world).map(tuple)


@st.composite
def chunks(draw: st.DrawFn, max_world: int = 8) -> Chunk:
    world = draw(st.integers(2, max_world))
    chunk = Chunk(
        counts=draw(item_counts(world, 200)),
        nodes=draw(node_layouts(world)),
        done=tuple(draw(st.lists(st.booleans(), min_size=world, max_size=world))),
        chunk_size=draw(st.integers(1, 40)),
        max_transfer=draw(st.integers(1, 20)),
        drop_last=draw(st.booleans()),
        topology=draw(st.sampled_from(TOPOLOGIES)),
    )
    note(repr(chunk))  # this hypothesis prints a failing example's arguments blank
    return chunk


@SETTINGS
@given(chunks())
def test_no_rank_is_asked_for_more_items_than_it_holds(chunk: Chunk) -> None:
    plan = chunk.plan()
    assert all(drawn(plan, r) <= chunk.counts[r] for r in chunk.ranks), (
        f"drawn {[drawn(plan, r) for r in chunk.ranks]} of {list(chunk.counts)}"
    )


@SETTINGS
@given(chunks())
def test_every_rank_takes_the_same_number_of_steps(chunk: Chunk) -> None:
    plan = chunk.plan()
    assert len({plan.steps(r) for r in chunk.ranks}) == 1


@SETTINGS
@given(chunks())
def test_a_chunk_has_at_most_chunk_size_steps(chunk: Chunk) -> None:
    plan = chunk.plan()
    assert plan.steps(0) <= chunk.chunk_size


def over_budget(plan: ChunkPlan, max_transfer: int) -> bool:
    return any(sent(plan, r) > max_transfer for r in plan.local)


@SETTINGS
@given(chunks(max_world=64))
def test_no_rank_sends_more_than_its_transfer_budget_except_in_a_single_step_that_needs_it(
    chunk: Chunk,
) -> None:
    plan = chunk.plan()
    if over_budget(plan, chunk.max_transfer):
        # The chunk is that one step, and the step needs more transfers than the budget allows at all.
        needy = sum(1 for n in chunk.counts if n == 0)
        assert plan.steps(0) == 1
        assert needy > sum(min(n - 1, chunk.max_transfer) for n in chunk.counts if n > 1)


@SETTINGS
@given(chunks())
def test_every_transfer_carries_items_from_one_rank_to_another(chunk: Chunk) -> None:
    plan = chunk.plan()
    for t in plan.transfers:
        assert t.count >= 1 and t.src != t.dst and {t.src, t.dst} <= set(chunk.ranks)


@SETTINGS
@given(chunks())
def test_a_rank_receives_items_only_once_its_own_are_used(chunk: Chunk) -> None:
    plan = chunk.plan()
    for r in chunk.ranks:
        if received(plan, r):
            assert drawn(plan, r) == chunk.counts[r]


@SETTINGS
@given(chunks())
def test_a_rank_gets_dummies_only_once_its_own_items_are_used(chunk: Chunk) -> None:
    plan = chunk.plan()
    for r in chunk.ranks:
        if plan.dummies[r]:
            assert drawn(plan, r) == chunk.counts[r]


@SETTINGS
@given(chunks())
def test_drop_last_never_pads_with_dummies(chunk: Chunk) -> None:
    assume(chunk.drop_last)
    plan = chunk.plan()
    assert not any(plan.dummies.values())


@SETTINGS
@given(chunks())
def test_a_plan_ends_the_stream_only_when_every_upstream_is_done(chunk: Chunk) -> None:
    plan = chunk.plan()
    if plan.finished:
        assert all(chunk.done)


@SETTINGS
@given(chunks(max_world=64))
def test_any_transfer_budget_builds_a_step_while_a_step_can_be_built(chunk: Chunk) -> None:
    # A step needs an item per rank; without drop_last, dummies complete one while any item is left.
    assume(sum(chunk.counts) >= (len(chunk.counts) if chunk.drop_last else 1))
    assert chunk.plan().steps(0) >= 1


@pytest.mark.parametrize("max_transfer", [0, -1])
def test_a_transfer_budget_below_one_is_a_config_error(max_transfer: int) -> None:
    chunk = Chunk((0, 0, 5), (0, 0, 0), (True,) * 3, 4, max_transfer, True, "none")
    with pytest.raises(ConfigError, match=f"max_transfer_per_round={max_transfer}"):
        chunk.plan()
    with pytest.raises(ConfigError, match="max_transfer_per_round"):
        balance_stage(max_transfer_per_round=max_transfer)


def test_sixteen_ranks_with_one_holding_items_build_a_step_at_the_default_budget() -> None:
    # 15 empty ranks need 15 transfers for one step, more than the default budget of 8: before, a ConfigError
    # ended every 16-rank job whose last items sat on one rank. The step is built and the chunk ends with it.
    world = 16
    chunk = Chunk(
        (40,) + (0,) * (world - 1),
        (0,) * world,
        (True,) * world,
        DEFAULTS.chunk_size,
        DEFAULTS.max_transfer_per_round,
        True,
        DEFAULTS.topology,
    )
    plan = chunk.plan()
    assert plan.local == {0: 1} | {r: 0 for r in range(1, world)}
    assert plan.transfers == [Transfer(0, r, 1) for r in range(1, world)]
    assert not plan.finished


# The two counter-examples that over-drew before the planner set each rank's own item aside first.


def test_a_donor_keeps_its_own_item_before_it_sends_any() -> None:
    # Rank 0 holds one item, and rank 1 on its node needs one: rank 0 keeps it, node 1 sends.
    chunk = Chunk((1, 0, 5, 5), (0, 0, 1, 1), (True,) * 4, 1, DEFAULTS.max_transfer_per_round, True, "node")
    plan = chunk.plan()
    assert plan.local == {0: 1, 1: 0, 2: 1, 3: 1}
    assert plan.transfers == [Transfer(2, 1, 1)]


def test_a_rank_keeps_its_last_item_when_the_fullest_donor_is_out_of_budget() -> None:
    # Rank 0 sends its budget (8) to rank 2; rank 1's ninth item is its own, so the chunk ends at 8 steps.
    chunk = Chunk(
        (100, 9, 0),
        (0, 0, 0),
        (True,) * 3,
        DEFAULTS.chunk_size,
        DEFAULTS.max_transfer_per_round,
        True,
        DEFAULTS.topology,
    )
    plan = chunk.plan()
    assert plan.local == {0: 8, 1: 8, 2: 0}
    assert plan.transfers == [Transfer(0, 2, 8)]


# -- whole streams, chunk by chunk ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """Every rank's upstream length and node, and the stage's options."""

    lengths: tuple[int, ...]
    nodes: tuple[int, ...]
    buffer_size: int
    chunk_size: int
    max_transfer: int
    drop_last: bool
    topology: Topology


def few_holders(world: int, most: int) -> st.SearchStrategy[tuple[int, ...]]:
    """The end of an epoch on a large world: most ranks empty, a few still holding items."""
    holders = st.dictionaries(st.integers(0, world - 1), st.integers(1, most), min_size=1, max_size=3)
    return holders.map(lambda held: tuple(held.get(r, 0) for r in range(world)))


@st.composite
def streams(draw: st.DrawFn, max_world: int = 6, any_budget: bool = False) -> Stream:
    """Streams on 2..max_world ranks; budgets of world - 1 or more, or with `any_budget` of 1 or more."""
    world = draw(st.integers(2, max_world))
    chunk_size = draw(st.integers(1, 20))
    stream = Stream(
        lengths=draw(st.one_of(item_counts(world, 150), few_holders(world, 150))),
        nodes=draw(node_layouts(world)),
        buffer_size=draw(st.integers(chunk_size, 40)),
        chunk_size=chunk_size,
        max_transfer=draw(st.integers(1 if any_budget else world - 1, 12)),
        drop_last=draw(st.booleans()),
        topology=draw(st.sampled_from(TOPOLOGIES)),
    )
    note(repr(stream))
    return stream


def take(buffer: deque[Item], count: int, rank: int) -> list[Item]:
    assert count <= len(buffer), f"rank {rank} is told to use {count} items and holds {len(buffer)}"
    return [buffer.popleft() for _ in range(count)]


def run_stream(stream: Stream) -> list[list[Item]]:
    """What every rank yields: BalanceNode's chunk loop, with the transfers done in memory."""
    world = len(stream.lengths)
    upstream = [deque((r, i) for i in range(n)) for r, n in enumerate(stream.lengths)]
    buffers: list[deque[Item]] = [deque() for _ in range(world)]
    done = [False] * world
    yielded: list[list[Item]] = [[] for _ in range(world)]
    for chunk in range(sum(stream.lengths) + 2):
        for r in range(world):  # BalanceNode._fill
            while len(buffers[r]) < max(stream.buffer_size, world) and not done[r]:
                if upstream[r]:
                    buffers[r].append(upstream[r].popleft())
                else:
                    done[r] = True
        statuses = [Status(r, stream.nodes[r], len(buffers[r]), done[r], chunk) for r in range(world)]
        plan = plan_chunk(statuses, stream.chunk_size, stream.max_transfer, stream.drop_last, stream.topology)
        outputs = [take(buffers[r], plan.local[r], r) for r in range(world)]
        for t in plan.transfers:
            outputs[t.dst] += take(buffers[t.src], t.count, t.src)
        for r in range(world):
            outputs[r] += [DUMMY] * plan.dummies[r]
            assert len(outputs[r]) == plan.steps(r), (
                f"rank {r} yields {len(outputs[r])}, planned {plan.steps(r)}"
            )
            yielded[r] += outputs[r]
        if plan.finished or plan.steps(0) == 0:
            return yielded
    raise AssertionError(f"the stream did not end after {sum(stream.lengths) + 2} chunks")


def real(yielded: Sequence[Sequence[Item]]) -> Counter[Item]:
    return Counter(item for items in yielded for item in items if item != DUMMY)


@STREAM_SETTINGS
@given(streams())
def test_every_rank_yields_the_same_number_of_items_over_a_stream(stream: Stream) -> None:
    yielded = run_stream(stream)
    assert len({len(items) for items in yielded}) == 1


@STREAM_SETTINGS
@given(streams())
def test_without_drop_last_every_real_item_is_yielded_exactly_once(stream: Stream) -> None:
    assume(not stream.drop_last)
    everything = Counter((r, i) for r, n in enumerate(stream.lengths) for i in range(n))
    assert real(run_stream(stream)) == everything


@STREAM_SETTINGS
@given(streams())
def test_drop_last_yields_each_item_at_most_once_and_drops_fewer_than_there_are_ranks(stream: Stream) -> None:
    assume(stream.drop_last)
    counted = real(run_stream(stream))
    assert max(counted.values(), default=1) == 1
    assert 0 <= sum(stream.lengths) - counted.total() < len(stream.lengths)


@STREAM_SETTINGS
@given(streams(max_world=64, any_budget=True))
def test_any_world_and_transfer_budget_yield_every_item_once_and_equal_counts(stream: Stream) -> None:
    # Up to 64 ranks and budgets down to 1: at an epoch's end one rank may hold items while more ranks are
    # empty than the budget can serve in a step. Every chunk still makes progress and the stream ends.
    yielded = run_stream(stream)
    assert len({len(items) for items in yielded}) == 1
    if stream.drop_last:
        assert max(real(yielded).values(), default=1) == 1
        assert 0 <= sum(stream.lengths) - real(yielded).total() < len(stream.lengths)
    else:
        assert real(yielded) == Counter((r, i) for r, n in enumerate(stream.lengths) for i in range(n))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_sixteen_rank_stream_with_one_rank_holding_items_ends_at_the_default_budget(
    drop_last: bool,
) -> None:
    world = 16
    stream = Stream(
        (100,) + (0,) * (world - 1),
        (0,) * world,
        DEFAULTS.buffer_size,
        DEFAULTS.chunk_size,
        DEFAULTS.max_transfer_per_round,
        drop_last,
        DEFAULTS.topology,
    )
    yielded = run_stream(stream)
    assert len({len(items) for items in yielded}) == 1
    expected = 100 if not drop_last else 100 - 100 % world
    assert real(yielded).total() == expected and max(real(yielded).values()) == 1
