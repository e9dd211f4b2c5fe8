"""The next-use index's ordered sets over numpy arrays agree with plain Python sets and dicts."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcached.planning.orders import BLOCK, MinOrder, PositionSet, distinct


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 3 * BLOCK))
def test_a_position_set_answers_as_a_set_of_positions(seed: int, length: int) -> None:
    rng = random.Random(seed)
    positions = PositionSet(length)
    model: set[int] = set()
    for _ in range(60):
        op = rng.randrange(5)
        if op == 0:
            position = rng.randrange(length)
            positions.add(position)
            model.add(position)
        elif op == 1 and model:
            position = rng.choice(sorted(model))
            positions.remove(position)
            model.discard(position)
        elif op == 2:
            new = sorted(set(rng.sample(range(length), min(length, rng.randrange(40)))) - model)
            positions.add_many(np.asarray(new, dtype=np.int64))
            model.update(new)
        elif op == 3 and model:
            gone = rng.sample(sorted(model), rng.randrange(len(model) + 1))
            positions.remove_many(np.asarray(sorted(gone), dtype=np.int64))
            model.difference_update(gone)
        else:
            start = rng.randrange(length)
            stop = rng.randrange(start, length + 1)
            assert positions.between(start, stop).tolist() == sorted(p for p in model if start <= p < stop)
        assert len(positions) == len(model)
        assert positions.last() == (max(model) if model else None)
        below = rng.randrange(length + 1)
        assert positions.before(below) == max((p for p in model if p < below), default=None)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ids=st.integers(1, 3 * BLOCK))
def test_a_min_order_gives_the_accepted_id_with_the_smallest_key(seed: int, ids: int) -> None:
    rng = random.Random(seed)
    order = MinOrder(capacity=rng.choice([1, ids]))
    model: dict[int, int] = {}
    keys = rng.sample(range(-(10**7), 10**7), 60 * 60)  # unique keys, as the index's are
    for _ in range(60):
        op = rng.randrange(5)
        if op == 0:
            uid = rng.randrange(ids)
            key = model[uid] if uid in model and rng.random() < 0.3 else keys.pop()  # refiled, or moved
            order.set(uid, key)
            model[uid] = key
        elif op == 1:
            uid = rng.randrange(ids)
            order.discard(uid)
            model.pop(uid, None)
        elif op == 2:
            chosen = sorted(set(rng.sample(range(ids), min(ids, rng.randrange(50)))))
            new_keys = [keys.pop() for _ in chosen]
            order.set_many(np.asarray(chosen, dtype=np.int64), np.asarray(new_keys, dtype=np.int64))
            model.update(zip(chosen, new_keys, strict=True))
        elif op == 3:
            chosen = sorted(set(rng.sample(range(ids), min(ids, rng.randrange(50)))))
            order.discard_many(np.asarray(chosen, dtype=np.int64))
            for uid in chosen:
                model.pop(uid, None)
        refused = set(rng.sample(sorted(model), rng.randrange(len(model) + 1))) if model else set()
        expected = min((uid for uid in model if uid not in refused), key=model.__getitem__, default=None)
        assert order.first(lambda uid, refused=refused: uid not in refused) == expected  # type: ignore[misc]
        assert len(order) == len(model)
        assert all(order.key(uid) == key for uid, key in model.items())  # `first` put back what it passed


def test_distinct_values_come_ascending() -> None:
    assert distinct(np.asarray([5, 1, 5, 3, 1], dtype=np.int32)).tolist() == [1, 3, 5]
    assert distinct(np.asarray([], dtype=np.int32)).tolist() == []
