"""Dataset and TorchLoader share their stage builders: a bad argument is a ConfigError on either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from shardcache import ConfigError, Dataset

BAD_CALLS = {
    "map": lambda f: f.map(3),
    "shuffle-size": lambda f: f.shuffle(0),
    "shuffle-initial": lambda f: f.shuffle(4, initial=-1),
    "assemble": lambda f: f.assemble(None),
    "batch-size": lambda f: f.batch(True),
    "batch-collate": lambda f: f.batch(2, collate_fn="nope"),
}


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return Dataset.from_source("tars", make_tars(tmp_path, 1, 2), daemon=None)


@pytest.mark.parametrize("call", list(BAD_CALLS))
def test_a_bad_dataset_stage_argument_is_a_config_error(dataset: Dataset, call: str) -> None:
    with pytest.raises(ConfigError):
        BAD_CALLS[call](dataset)


@pytest.mark.parametrize("call", list(BAD_CALLS))
def test_a_bad_loader_stage_argument_is_the_same_config_error(dataset: Dataset, call: str) -> None:
    pytest.importorskip("torch.utils.data")
    from shardcache import TorchLoader

    with pytest.raises(ConfigError) as on_dataset:
        BAD_CALLS[call](dataset)
    with pytest.raises(ConfigError) as on_loader:
        BAD_CALLS[call](TorchLoader(dataset))
    assert str(on_loader.value) == str(on_dataset.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": 42}, "expected a shardcache.Dataset or an iterable"),
        ({"num_workers": -1}, "num_workers=-1"),
    ],
)
def test_torch_loader_arguments_are_config_errors(
    dataset: Dataset, kwargs: dict[str, Any], message: str
) -> None:
    pytest.importorskip("torch.utils.data")
    from shardcache import TorchLoader

    with pytest.raises(ConfigError, match=message):
        TorchLoader(**{"dataset": dataset, **kwargs})


def test_balance_sends_at_most_16_items_per_rank_and_chunk_by_default(dataset: Dataset) -> None:
    """mvp-dataset's default max_transfer_per_round, on TorchLoader.balance and its builder."""
    pytest.importorskip("torch.utils.data")
    from shardcache import TorchLoader
    from shardcache.stages import builders

    assert builders.balance_stage().max_transfer_per_round == 16
    (stage,) = TorchLoader(dataset).balance().stages
    assert getattr(stage, "max_transfer_per_round", None) == 16
