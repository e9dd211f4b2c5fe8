"""Every resume layout's bytes, pinned: a state of each kind (a Dataset's envelope over shuffle, batch,
unbatch and map nodes; a mix; a TorchLoader's with its workers' merge and a loader-side shuffle; merged
states; an elastic resume's origin) serialises to the JSON the code wrote before its layouts were typed
(`golden_states.json`, with the temporary directory and the fingerprints, which hash it, masked), and each
pinned state still loads and resumes where it says.

Regenerate the goldens only for a deliberate format change (then raise `STATE_VERSION`):
``python -m tests.client.resume.test_state_layouts``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import keys, make_tars, slot_contexts
from shardcache import Dataset, RuntimeContext, TorchLoader, merge_states

GOLDEN = Path(__file__).with_name("golden_states.json")
FINGERPRINT = r'"[0-9a-f]{32}"'
DIGEST = r"=[0-9a-f]{12}\b"
SEED = 3


def _tars(root: Path) -> list[str]:
    return make_tars(root / "tars", count=4, samples=5)


def _dataset(tars: list[str], ctx: RuntimeContext | None = None) -> Dataset:
    context = ctx if ctx is not None else RuntimeContext(seed=SEED)
    return Dataset.from_source("tars", tars, daemon=None, context=context).shuffle(4).batch(2).unbatch()


def _elastic(tars: list[str], ctx: RuntimeContext | None = None) -> Dataset:
    """A pipeline an elastic resume reads through (one shuffle, then position-only stages)."""
    context = ctx if ctx is not None else RuntimeContext(seed=SEED)
    return Dataset.from_source("tars", tars, daemon=None, context=context).shuffle(4).batch(2)


def _mix(tars: list[str]) -> Dataset:
    ctx = RuntimeContext(seed=SEED)
    first = Dataset.from_source("tars", tars[:2], daemon=None, context=ctx)
    second = Dataset.from_source("tars", tars[2:], daemon=None, context=ctx)
    return Dataset.mix({"a": first, "b": second}, seed=1, context=ctx)


def _plain_loader(tars: list[str]) -> TorchLoader:
    # `list` collates: its name (in the state's descriptions) is the same wherever the test runs from.
    ds = Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(seed=SEED))
    return TorchLoader(ds, batch_size=2, collate_fn=list)


def _loader(tars: list[str]) -> TorchLoader:
    return _plain_loader(tars).unbatch().shuffle(3).batch(2)


def _after(it: Any, count: int) -> Any:
    for _ in range(count):
        next(it)
    return it.state_dict()


def layouts(root: Path) -> dict[str, Any]:
    """One state of each layout, taken at a fixed point of a fixed pipeline over tars under `root`."""
    tars = _tars(root)
    states: dict[str, Any] = {"initial": _dataset(tars).state_dict()}
    states["dataset"] = _after(iter(_dataset(tars)), 7)
    ended = iter(_dataset(tars))
    list(ended)
    states["ended"] = ended.state_dict()
    states["mix"] = _after(iter(_mix(tars)), 6)
    slots = [_after(_elastic(tars).iter_context(ctx), 2) for ctx in slot_contexts(2, seed=SEED)]
    states["merged"] = merge_states(slots)
    elastic = _elastic(tars)
    elastic.load_state_dict(states["merged"])
    states["elastic"] = _after(iter(elastic), 2)
    if _has_torch():
        states["loader_plain"] = _after(iter(_plain_loader(tars)), 3)
        states["loader"] = _after(iter(_loader(tars)), 3)
        states["loader_merged"] = merge_states([states["loader"]])
    return states


def _has_torch() -> bool:
    try:
        import torch.utils.data  # noqa: F401
    except ImportError:
        return False
    return True


def masked(state: Any, root: Path) -> str:
    """`state` as JSON, with the temporary directory and the hashes of it (fingerprints, the digests of
    urls and member pipelines in the descriptions) masked."""
    text = json.dumps(state).replace(str(root), "<root>")
    return re.sub(DIGEST, "=<hex>", re.sub(FINGERPRINT, '"<hex>"', text))


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("layouts")
    return root, layouts(root)


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    found: dict[str, str] = json.loads(GOLDEN.read_text())
    return found


LAYOUTS = [
    "initial",
    "dataset",
    "ended",
    "mix",
    "merged",
    "elastic",
    "loader_plain",
    "loader",
    "loader_merged",
]


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_state_serialises_to_the_pinned_bytes(
    name: str, pinned: tuple[Path, dict[str, Any]], golden: dict[str, str]
) -> None:
    root, states = pinned
    if name not in states:
        pytest.skip("needs torch")
    assert masked(states[name], root) == golden[name]


def _unmasked(name: str, root: Path, golden: dict[str, str], states: dict[str, Any]) -> Any:
    """The pinned state `name` for the pipeline under `root`: the golden text with this run's directory
    and the fingerprints this run's state carries put back (in order)."""
    current = json.dumps(states[name]).replace(str(root), "<root>")
    text = golden[name].replace("<root>", str(root))
    fingerprints = iter(re.findall(FINGERPRINT, current))
    digests = iter(re.findall(DIGEST, current))
    text = re.sub('"<hex>"', lambda _: next(fingerprints), text)
    return json.loads(re.sub("=<hex>", lambda _: next(digests), text))


@pytest.mark.parametrize(
    ("name", "pipeline"), [("dataset", _dataset), ("merged", _elastic), ("elastic", _elastic)]
)
def test_a_pinned_dataset_state_loads_and_resumes_where_it_says(
    name: str, pipeline: Any, pinned: tuple[Path, dict[str, Any]], golden: dict[str, str]
) -> None:
    root, states = pinned
    resumed = pipeline(_tars_at(root))
    resumed.load_state_dict(_unmasked(name, root, golden, states))
    expected = pipeline(_tars_at(root))
    expected.load_state_dict(states[name])
    assert list(resumed) == list(expected)


def test_a_pinned_mix_state_loads_and_resumes_where_it_says(
    pinned: tuple[Path, dict[str, Any]], golden: dict[str, str]
) -> None:
    root, states = pinned
    resumed = _mix(_tars_at(root))
    resumed.load_state_dict(_unmasked("mix", root, golden, states))
    expected = _mix(_tars_at(root))
    expected.load_state_dict(states["mix"])
    assert keys(resumed) == keys(expected)


def test_a_pinned_loader_state_loads_and_resumes_where_it_says(
    pinned: tuple[Path, dict[str, Any]], golden: dict[str, str]
) -> None:
    root, states = pinned
    if "loader" not in states:
        pytest.skip("needs torch")
    resumed = _loader(_tars_at(root))
    resumed.load_state_dict(_unmasked("loader", root, golden, states))
    expected = _loader(_tars_at(root))
    expected.load_state_dict(states["loader"])
    assert list(resumed) == list(expected)


def _tars_at(root: Path) -> list[str]:
    return sorted(str(path) for path in (root / "tars").iterdir())


if __name__ == "__main__":  # regenerate the goldens (see the module)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        GOLDEN.write_text(
            json.dumps({name: masked(state, base) for name, state in layouts(base).items()}, indent=1) + "\n"
        )
