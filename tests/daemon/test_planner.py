"""The planner's behaviours one by one: cursors, next use across epochs and jobs, staleness, LRU, eviction."""

from __future__ import annotations

import pytest

from shardcached.planning import Planner


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def belady(clock: Clock, **kwargs: object) -> Planner:
    return Planner(policy="belady", clock=clock, **kwargs)  # type: ignore[arg-type]


def test_unknown_policy_is_a_value_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="belady, lru"):
        Planner(policy="fifo")


def test_next_use_counts_opens_ahead_of_the_cursor(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("j", 0, 0, ["a", "b", "c"])
    assert [planner.next_use(u) for u in "abc"] == [1.0, 2.0, 3.0]
    assert planner.next_use("zzz") is None


def test_an_open_under_the_plan_advances_its_cursor(clock: Clock) -> None:
    planner = belady(clock)
    pid = planner.add_plan("j", 0, 0, ["a", "b", "c"])
    clock.now = 1.0
    planner.record_open("a", pid)
    assert planner.next_use("a") is None
    assert planner.describe()[0]["cursor"] == 1


def test_a_skipped_position_is_passed_over(clock: Clock) -> None:
    planner = belady(clock)
    pid = planner.add_plan("j", 0, 0, ["a", "b", "c", "d"])
    planner.record_open("c", pid)
    assert planner.describe()[0]["cursor"] == 3
    assert planner.next_use("b") is None


def test_a_repeated_open_does_not_move_the_cursor(clock: Clock) -> None:
    planner = belady(clock)
    pid = planner.add_plan("j", 0, 0, ["a", "b", "a", "c"])
    planner.record_open("a", pid)
    planner.record_open("b", pid)
    planner.record_open("b", pid)
    assert planner.describe()[0]["cursor"] == 2
    planner.record_open("a", pid)
    assert planner.describe()[0]["cursor"] == 3


def test_an_unknown_plan_id_is_ignored(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("j", 0, 0, ["a"])
    planner.record_open("a", "no-such-plan")
    assert planner.next_use("a") == 1.0


def test_next_epoch_positions_come_after_the_rest_of_the_current_epoch(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("j", 0, 1, ["x", "a"])  # registered out of order on purpose
    now = planner.add_plan("j", 0, 0, ["a", "b", "c"])
    planner.record_open("a", now)
    assert planner.next_use("b") == 1.0
    assert planner.next_use("x") == 3.0
    assert planner.next_use("a") == 4.0


def test_opening_under_the_next_epoch_finishes_the_previous_one(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("j", 0, 0, ["a", "b", "c"])
    nxt = planner.add_plan("j", 0, 1, ["c", "d"])
    planner.record_open("c", nxt)
    assert planner.next_use("b") is None
    assert planner.next_use("d") == 1.0


def test_registering_the_same_plan_again_keeps_its_id_and_cursor(clock: Clock) -> None:
    planner = belady(clock)
    pid = planner.add_plan("j", 0, 0, ["a", "b"])
    planner.record_open("a", pid)
    assert planner.add_plan("j", 0, 0, ["a", "b"]) == pid
    assert planner.describe()[0]["cursor"] == 1
    assert planner.plan_count == 1


def test_registering_other_urls_for_the_same_epoch_replaces_the_plan(clock: Clock) -> None:
    planner = belady(clock)
    old = planner.add_plan("j", 0, 0, ["a", "b"])
    new = planner.add_plan("j", 0, 0, ["c"])
    assert new != old and not planner.has_plan(old) and planner.has_plan(new)
    assert planner.next_use("a") is None


def test_a_replaced_only_plan_still_expires_when_its_slot_goes_idle(clock: Clock) -> None:
    planner = belady(clock, stale_after_s=10.0)
    planner.add_plan("j", 0, 0, ["a", "b"])
    new = planner.add_plan("j", 0, 0, ["c", "d"])
    clock.now = 10.0
    assert planner.expire_stale() == 1
    assert not planner.has_plan(new)


def test_a_replaced_only_plan_gets_a_prefetch_window(clock: Clock) -> None:
    planner = belady(clock, prefetch_depth=2)
    planner.add_plan("j", 0, 0, ["a", "b"])
    planner.add_plan("j", 0, 0, ["c", "d", "e"])
    assert planner.prefetch_candidates(lambda url: False, 10) == ["c", "d"]


def test_uses_are_ordered_by_estimated_time_when_jobs_read_at_different_speeds(clock: Clock) -> None:
    planner = belady(clock)
    slow = planner.add_plan("slow", 0, 0, ["s0", "s1", "s2", "s3"])
    fast = planner.add_plan("fast", 0, 0, ["f0", "f1", "f2", "f3", "f4", "f5"])
    for now, url, plan in (
        (0, "s0", slow),
        (4, "s1", slow),
        (5, "f0", fast),
        (6, "f1", fast),
        (7, "f2", fast),
    ):
        clock.now = float(now)
        planner.record_open(url, plan)
    # slow: every 4 s since 4 -> s2 at 8, s3 at 12; fast: every 1 s since 7 -> f3 at 8, f4 at 9, f5 at 10
    assert (
        planner.choose_victim(["s3", "f5"]) == "s3"
    )  # 2 opens ahead of a slow slot is later than 3 of a fast
    assert planner.choose_victim(["s2", "f5"]) == "f5"
    # next_use is in opens at the median pace: f5 is 3 s away, the median interval is (4 + 1) / 2 s
    assert planner.next_use("f5") == pytest.approx(3 / 2.5)


def test_two_jobs_share_a_shard_and_the_nearer_use_counts(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("a", 0, 0, ["x", "y", "shared"])
    planner.add_plan("b", 0, 0, ["shared", "z"])
    assert planner.next_use("shared") == 1.0
    assert planner.choose_victim(["shared", "y", "z"]) == "y"


def test_a_deleted_plan_stops_influencing_eviction(clock: Clock) -> None:
    planner = belady(clock)
    keep = planner.add_plan("a", 0, 0, ["p", "q", "r"])
    gone = planner.add_plan("b", 0, 0, ["x"])
    assert planner.choose_victim(["x", "r"]) == "r"
    assert planner.delete_plan(gone)
    assert not planner.delete_plan(gone)
    assert planner.next_use("x") is None
    assert planner.choose_victim(["x", "r"]) == "x"
    assert planner.has_plan(keep)


def test_a_stale_plan_is_dropped_and_stops_influencing_eviction(clock: Clock) -> None:
    planner = belady(clock, stale_after_s=60.0)
    idle = planner.add_plan("idle", 0, 0, ["x", "y"])
    busy = planner.add_plan("busy", 0, 0, ["p", "q", "r", "s"])
    clock.now = 59.0
    planner.record_open("p", busy)
    clock.now = 61.0
    assert planner.choose_victim(["x", "q"]) == "x"
    assert not planner.has_plan(idle) and planner.has_plan(busy)
    assert planner.plan_count == 1


def test_expire_stale_reports_how_many_plans_went(clock: Clock) -> None:
    planner = belady(clock, stale_after_s=10.0)
    planner.add_plan("j", 0, 0, ["a"])
    planner.add_plan("j", 0, 1, ["b"])
    clock.now = 5.0
    assert planner.expire_stale() == 0
    clock.now = 10.0
    assert planner.expire_stale() == 2


def test_the_next_epoch_plan_stays_while_its_slot_keeps_opening(clock: Clock) -> None:
    planner = belady(clock, stale_after_s=10.0)
    cur = planner.add_plan("j", 0, 0, [f"u{i}" for i in range(100)])
    nxt = planner.add_plan("j", 0, 1, ["v"])
    for i in range(30):
        clock.now = float(i)
        planner.record_open(f"u{i}", cur)
    assert planner.expire_stale() == 0
    assert planner.has_plan(nxt)


def test_unplanned_shards_are_evicted_first_least_recent_first(clock: Clock) -> None:
    planner = belady(clock)
    planner.add_plan("j", 0, 0, ["a", "b"])
    planner.record_open("old")
    planner.record_open("new")
    assert planner.choose_victim(["b", "new", "old", "a"]) == "old"


def test_a_prefetch_waits_rather_than_evict_a_shard_needed_sooner(clock: Clock) -> None:
    planner = belady(clock, displace_ahead=4)
    planner.add_plan("j", 0, 0, ["a", "b", "c", "d"])
    assert planner.choose_victim(["a", "b"], incoming="c") is None
    assert planner.choose_victim(["a", "d"], incoming="c") == "d"
    assert planner.choose_victim(["a", "b"], incoming=None) == "b"


def test_a_prefetch_displaces_nothing_until_its_shard_is_next_for_its_slot(clock: Clock) -> None:
    planner = belady(clock)  # displace_ahead=1: farther prefetches only fill free space
    pid = planner.add_plan("j", 0, 0, ["a", "b", "c"])
    planner.record_open("old")
    assert planner.choose_victim(["old"], incoming="b") is None
    planner.record_open("a", pid)
    assert planner.choose_victim(["old"], incoming="b") == "old"


def test_a_prefetch_of_a_shard_in_no_plan_displaces_nothing(clock: Clock) -> None:
    planner = belady(clock)
    planner.record_open("old")
    assert planner.choose_victim(["old"], incoming="stray") is None


def test_prefetch_candidates_are_nearest_first_within_the_depth(clock: Clock) -> None:
    planner = belady(clock, prefetch_depth=2)
    planner.add_plan("a", 0, 0, ["a0", "a1", "a2"])
    planner.add_plan("b", 0, 0, ["b0", "b1", "b2"])
    got = planner.prefetch_candidates(skip=lambda url: url == "a0", limit=10)
    assert set(got) == {"a1", "b0", "b1"}
    assert got.index("b0") < got.index("a1")
    assert planner.prefetch_candidates(skip=lambda url: False, limit=1) in (["a0"], ["b0"])


def test_prefetch_looks_across_the_epoch_boundary(clock: Clock) -> None:
    planner = belady(clock, prefetch_depth=3)
    planner.add_plan("j", 0, 0, ["a"])
    planner.add_plan("j", 0, 1, ["b", "c", "d"])
    assert planner.prefetch_candidates(skip=lambda url: False, limit=10) == ["a", "b", "c"]


def test_lru_evicts_the_least_recently_opened_and_never_prefetches(clock: Clock) -> None:
    planner = Planner(policy="lru", clock=clock)
    pid = planner.add_plan("j", 0, 0, ["a", "b", "c"])
    for url in ("a", "b", "c", "a"):
        planner.record_open(url, pid)
    assert planner.choose_victim(["a", "b", "c"], incoming="x") == "b"
    assert planner.prefetch_candidates(skip=lambda url: False, limit=10) == []


def test_a_forgotten_shard_counts_as_least_recent(clock: Clock) -> None:
    planner = Planner(policy="lru", clock=clock)
    planner.record_open("a")
    planner.record_open("b")
    planner.forget("b")
    assert planner.choose_victim(["a", "b"]) == "b"


def test_no_candidates_means_no_victim(clock: Clock) -> None:
    assert belady(clock).choose_victim([], incoming=None) is None


def test_positional_arguments_follow_the_published_interface(clock: Clock) -> None:
    planner = Planner("lru", 3, 5.0, clock)
    assert (planner.policy, planner.prefetch_depth, planner.stale_after_s, planner.displace_ahead) == (
        "lru",
        3,
        5.0,
        1,
    )
