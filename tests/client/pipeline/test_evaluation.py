"""`Dataset.for_evaluation()`: a validation set reads one fixed order, every sample exactly once across the
ranks, the same in every pass (`shardcache.pipeline.evaluation`). Ranks are simulated with explicit
contexts here; tests/frameworks/ runs each framework's evaluation path on two real DDP ranks."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from harness.pipelines import make_tars
from harness.start_methods import worker_context

torch_data = pytest.importorskip("torch.utils.data")

from shardcache import ConfigError, Dataset, RuntimeContext, TorchLoader  # noqa: E402

SHARDS, SAMPLES = 5, 7  # 35 samples: 3 ranks cannot share them evenly
ALL = {f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(SAMPLES)}


def keys_and_pads(samples: Any) -> list[tuple[str, bool]]:
    return [(sample["__key__"], bool(sample.get("__pad__", False))) for sample in samples]


def collate_keys(batch: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return keys_and_pads(batch)


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_tars(tmp_path_factory.mktemp("evaluation"), SHARDS, SAMPLES)


def evaluation(tars: list[str], rank: int = 0, world: int = 1, **kwargs: Any) -> Dataset:
    ctx = RuntimeContext(rank=rank, world_size=world, seed=11)
    return Dataset.from_source("tars", tars, daemon=None, context=ctx).for_evaluation(**kwargs)


def test_an_evaluation_dataset_reads_the_same_order_in_every_pass(tars: list[str]) -> None:
    ds = evaluation(tars, 1, 3)
    passes = [keys_and_pads(ds) for _ in range(3)]
    ds.set_epoch(4)  # what frameworks do before every epoch: ignored
    passes.append(keys_and_pads(ds))
    assert passes[1:] == passes[:-1] and passes[0]


def test_an_evaluation_dataset_reads_its_shards_in_source_order(tars: list[str]) -> None:
    assert [key for key, _ in keys_and_pads(evaluation(tars))] == sorted(ALL)


def test_ranks_of_an_evaluation_dataset_read_every_sample_once_and_the_same_number(tars: list[str]) -> None:
    shares = [keys_and_pads(evaluation(tars, r, 3)) for r in range(3)]
    real = Counter(key for share in shares for key, pad in share if not pad)
    assert set(real) == ALL and set(real.values()) == {1}
    assert [len(share) for share in shares] == [12, 12, 12]  # ceil(35 / 3)
    assert sum(pad for share in shares for _, pad in share) == 1


def test_an_evaluation_dataset_without_padding_reads_whole_shards_per_rank(tars: list[str]) -> None:
    shares = [keys_and_pads(evaluation(tars, r, 3, even=None)) for r in range(3)]
    real = Counter(key for share in shares for key, pad in share)
    assert set(real) == ALL and set(real.values()) == {1}
    assert sorted(len(share) for share in shares) == [7, 14, 14]  # whole shards of 7: uneven steps


def test_an_evaluation_dataset_refuses_drop_which_would_leave_samples_out(tars: list[str]) -> None:
    with pytest.raises(ConfigError, match="'drop' would leave samples out"):
        evaluation(tars, even="drop")


def test_an_evaluation_dataset_refuses_a_mix(tars: list[str]) -> None:
    member = Dataset.from_source("tars", tars, daemon=None)
    with pytest.raises(ConfigError, match="evaluate each dataset on its own"):
        Dataset.mix({"a": member, "b": member}, seed=0).for_evaluation()


def test_an_evaluation_dataset_refuses_an_endless_source(tars: list[str]) -> None:
    with pytest.raises(ConfigError, match="resample"):
        Dataset.from_source("tars", tars, daemon=None, resample=True).for_evaluation()


def test_stages_after_an_evaluation_dataset_keep_it_one(tars: list[str]) -> None:
    ds = evaluation(tars, 2, 3).map(lambda sample: sample).shuffle(5)
    assert ds.evaluation
    assert keys_and_pads(ds) == keys_and_pads(ds)  # even the shuffle reads one order: its epoch is fixed


def test_an_evaluation_loader_reads_the_same_batches_in_every_pass(
    tars: list[str], start_method: str
) -> None:
    loader = TorchLoader(
        evaluation(tars, 0, 3),
        batch_size=4,
        num_workers=2,
        collate_fn=collate_keys,
        multiprocessing_context=worker_context(start_method),
    )
    first = list(loader)
    loader.set_epoch(2)
    assert list(loader) == first == list(loader) and len(loader) == len(first)
    loader.close()


def test_an_evaluation_loader_always_starts_its_next_pass_from_the_beginning(tars: list[str]) -> None:
    loader = TorchLoader(evaluation(tars, 1, 3), batch_size=4, num_workers=2, collate_fn=collate_keys)
    whole = list(loader)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state["state"] is None  # frameworks save evaluation loaders' states too: nothing to resume
    fresh = TorchLoader(evaluation(tars, 1, 3), batch_size=4, num_workers=2, collate_fn=collate_keys)
    fresh.load_state_dict(state)
    assert list(fresh) == whole
    loader.close()
    fresh.close()


def test_an_evaluation_dataset_in_a_plain_dataloader_reads_the_same_order_each_pass(tars: list[str]) -> None:
    ds = evaluation(tars, 2, 3)
    ds.count_samples()  # a plain DataLoader's workers cannot share counts: the main process takes them
    loader = torch_data.DataLoader(
        ds, batch_size=4, num_workers=2, collate_fn=collate_keys, persistent_workers=True
    )
    passes = [list(loader) for _ in range(2)]
    assert passes[0] == passes[1] and len(loader) == len(passes[0])
