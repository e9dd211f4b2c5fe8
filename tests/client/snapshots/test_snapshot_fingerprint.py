"""Fingerprints of stage callables: stable across processes, changed by anything that changes the output."""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from shardcache.errors import ConfigError
from shardcache.snapshots.fingerprint import check_stable_callable, fingerprint_of

SCALE = 2


def double(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "x": sample["x"] * 2}


def scaled(sample: dict[str, Any], factor: int = 3) -> dict[str, Any]:
    return {**sample, "x": sample["x"] * factor * SCALE}


class Packer:
    def __init__(self, context: object) -> None:
        self.buf: list[dict[str, Any]] = []

    def push(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        return [sample]

    def finish(self, *, drop_last: bool = False) -> list[dict[str, Any]]:
        return []


class Tokenizer:
    def __init__(self, max_len: int) -> None:
        self.max_len = max_len

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, "t": sample["text"][: self.max_len]}


def write_module(directory: Path, name: str, body: str) -> ModuleType:
    (directory / f"{name}.py").write_text(textwrap.dedent(body))
    sys.path.insert(0, str(directory))
    try:
        importlib.invalidate_caches()
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(directory))


def test_the_same_function_has_the_same_fingerprint_in_another_process() -> None:
    module = "tests.client.snapshots.test_snapshot_fingerprint"
    script = f"from {module} import double, fingerprint_of as f; print(f(double))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.strip() == fingerprint_of(double)


def test_editing_a_function_body_changes_its_fingerprint(tmp_path: Path) -> None:
    module = write_module(tmp_path, "fp_edit_mod", "def f(s):\n    return s + 1\n")
    before = fingerprint_of(module.f)
    module = write_module(tmp_path, "fp_edit_mod", "def f(s):\n    return s + 2\n")
    assert fingerprint_of(module.f) != before


def test_moving_a_function_down_its_file_keeps_its_fingerprint(tmp_path: Path) -> None:
    module = write_module(tmp_path, "fp_move_mod", "def f(s):\n    return s + 1\n")
    before = fingerprint_of(module.f)
    module = write_module(tmp_path, "fp_move_mod", "\n\n\n# a comment\ndef f(s):\n    return s + 1\n")
    assert fingerprint_of(module.f) == before


def test_a_changed_default_changes_the_fingerprint() -> None:
    assert fingerprint_of(functools.partial(scaled, factor=3)) != fingerprint_of(
        functools.partial(scaled, factor=4)
    )


def test_a_changed_global_constant_changes_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint_of(scaled)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 5)
    assert fingerprint_of(scaled) != before


def test_a_changed_helper_in_a_user_module_changes_the_fingerprint(tmp_path: Path) -> None:
    write_module(tmp_path, "fp_helper_mod", "def helper(s):\n    return s + 1\n")
    user = write_module(
        tmp_path, "fp_user_mod", "import fp_helper_mod\ndef f(s):\n    return fp_helper_mod.helper(s)\n"
    )
    before = fingerprint_of(user.f)
    write_module(tmp_path, "fp_helper_mod", "def helper(s):\n    return s + 100\n")
    assert fingerprint_of(user.f) != before


def test_closure_values_of_a_decorated_function_are_part_of_the_fingerprint(tmp_path: Path) -> None:
    source = """
        import functools
        def times(n):
            def wrap(fn):
                @functools.wraps(fn)
                def inner(s):
                    return fn(s) * n
                return inner
            return wrap
        @times({n})
        def f(s):
            return s
    """
    three = write_module(tmp_path, "fp_closure_mod", source.format(n=3)).f
    assert fingerprint_of(three) == fingerprint_of(three)
    four = write_module(tmp_path, "fp_closure_mod", source.format(n=4)).f
    assert fingerprint_of(three) != fingerprint_of(four)


def test_callable_objects_are_fingerprinted_by_class_code_and_state() -> None:
    assert fingerprint_of(Tokenizer(8)) == fingerprint_of(Tokenizer(8))
    assert fingerprint_of(Tokenizer(8)) != fingerprint_of(Tokenizer(16))


def test_numpy_constants_are_fingerprinted_by_content() -> None:
    assert fingerprint_of(np.arange(4)) == fingerprint_of(np.arange(4))
    assert fingerprint_of(np.arange(4)) != fingerprint_of(np.arange(1, 5))


def test_sets_are_fingerprinted_independently_of_hash_seed() -> None:
    script = (
        "from shardcache.snapshots.fingerprint import fingerprint_of as f; print(f({'a', 'b', 'c', 'dd'}))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(seen) == 1


def test_module_level_functions_classes_and_partials_are_accepted() -> None:
    for fn in (double, Packer, Tokenizer(4), functools.partial(scaled, factor=2), Tokenizer(4).__call__):
        check_stable_callable(fn, "map(fn)")


def test_a_lambda_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"lambda.*not stable across process restarts.*def"):
        check_stable_callable(lambda s: s, "map(<lambda>)")


def test_a_local_closure_is_rejected_with_a_clear_error() -> None:
    def local(sample: dict[str, Any]) -> dict[str, Any]:
        return sample

    with pytest.raises(ConfigError, match=r"local closure.*module level"):
        check_stable_callable(local, "map(local)")


def test_a_lambda_inside_a_partial_is_rejected() -> None:
    with pytest.raises(ConfigError, match="lambda"):
        check_stable_callable(functools.partial(lambda s, n: s, n=1), "map(partial)")
