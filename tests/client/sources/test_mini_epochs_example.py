"""The seed 001 loop in `examples/mini_epochs.py` runs on generated shards and resumes after checkpoints."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mini_epochs.py"


def load_example() -> ModuleType:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("mini_epochs_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_writes_a_checkpoint_per_epoch_and_chunk_then_resumes(tmp_path: Path, capsys) -> None:
    example = load_example()
    example.main(["--demo", "--workdir", str(tmp_path), "--epochs", "1", "--shards-per-chunk", "3"])
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        f"checkpoint_epoch0_chunk{k}.pt" for k in range(3)
    ]
    capsys.readouterr()

    example.main(
        ["--demo", "--workdir", str(tmp_path), "--epochs", "2", "--shards-per-chunk", "3", "--resume"]
    )
    printed = capsys.readouterr().out
    assert "epoch 0" not in printed and "epoch 1 chunk 0/3" in printed
    assert {p.name for p in checkpoints.iterdir()} >= {f"checkpoint_epoch1_chunk{k}.pt" for k in range(3)}
