"""Why a resume state does not fit: name the source or stage, and the argument, that differ.

A state carries one short description per part of its pipeline (`short_descriptions`): the source as its
kind, options, shard count and a hash of its URL list (the full list would make states large), then each
stage's own `describe()`. When fingerprints differ, `describe_mismatch(saved, current)` compares the two
lists and says what changed, e.g. ``stage 2 shuffle(): buffer_size differs (saved 7, now 8)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, TypedDict

from shardcache.memo import IdentityMemo
from shardcache.spec import PipelineSpec
from shardcache.stages import STAGE_SPECS

# Argument names of the positional descriptions, for the messages: each stage kind declares its own; the
# loader's part is written by `shardcache.loader.resume`.
_DESCRIBED_ARGS: dict[str, tuple[str, ...]] = {
    **{spec.kind: spec.described_args for spec in STAGE_SPECS},
    "loader": ("num_workers", "batch_size", "collate_fn", "drop_last"),
}
_LONG = 64


def _short(value: str) -> str:
    if len(value) <= _LONG:
        return value
    return f"<{len(value)} chars sha256:{hashlib.sha256(value.encode()).hexdigest()[:12]}>"


def source_description(description: str) -> str:
    """A source's `describe()` made short: options (long values hashed), shard count, URL-list hash.

    A mix's description (its arguments as JSON, then one ``name=fingerprint`` line per member) becomes
    ``mix(argument=value,...) members=N pipelines=<hash>``.
    """
    head, _, urls = description.partition("\n")
    return _source_short(head, urls.encode())


def _source_short(head: str, urls: bytes) -> str:
    """`source_description` of a description given as its first line and the UTF-8 of the rest (a source's
    `description_parts`: its URL buffer, hashed without a description made of it)."""
    if head.startswith("{"):
        arguments = json.loads(head)
        options = ",".join(_short(f"{k}={json.dumps(v)}") for k, v in sorted(arguments.items()))
        members = [m for m in urls.decode().split("\n") if m]
        digest = hashlib.sha256(urls).hexdigest()[:12]
        return f"mix({options}) members={len(members)} pipelines={digest}"
    name, _, rest = head.partition("(")
    args = _split_args(rest[:-1] if rest.endswith(")") else rest)
    options = ",".join(_short(a) for a in args)
    digest = hashlib.sha256(urls).hexdigest()[:12]
    return f"{name}({options}) shards={_lines(urls)} urls={digest}"


def _lines(text: bytes) -> int:
    """The non-empty lines of `text`; counted without splitting a list of 10^6 URLs into 10^6 strings."""
    if not text:
        return 0
    if b"\n\n" in text or text.startswith(b"\n") or text.endswith(b"\n"):
        return sum(1 for line in text.split(b"\n") if line)
    return text.count(b"\n") + 1


def stage_description(description: str) -> str:
    """A stage's `describe()` made short: its kind kept, long arguments hashed (`kind(<N chars ...>)`)."""
    if len(description) <= _LONG:
        return description
    kind, paren, rest = description.partition("(")
    if not paren or not kind.isidentifier():
        return _short(description)
    return f"{kind}({_short(rest[:-1] if rest.endswith(')') else rest)})"


def short_descriptions(source_description_text: str, stage_descriptions: Sequence[str]) -> list[str]:
    """What a state stores: the short source description, then each stage's description (long ones hashed,
    their kind kept).

    Args:
        source_description_text: `SourceSpec.describe()`.
        stage_descriptions: `Stage.describe()` of each stage, in order.
    """
    return [source_description(source_description_text), *(stage_description(d) for d in stage_descriptions)]


def pipeline_parts(source: Any, stages: Sequence[Any]) -> list[str]:
    """`short_descriptions` of a Dataset's source and stages: what its states carry as ``"stages"``."""
    head, urls = source.description_parts()
    return [_source_short(head, urls or b""), *(stage_description(stage.describe()) for stage in stages)]


_PARTS: IdentityMemo[tuple[str, ...]] = IdentityMemo()


def spec_parts(spec: PipelineSpec) -> list[str]:
    """`pipeline_parts` of a pipeline, memoised per spec (its source description lists every shard URL)."""
    return list(_PARTS.get(spec, None, lambda: tuple(pipeline_parts(spec.source, spec.stages))))


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated parts of an argument list (brackets and quotes respected)."""
    parts: list[str] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:]:
        parts.append(text[start:])
    return parts


def _parse(description: str) -> tuple[str, list[str], str]:
    """(name, arguments, trailer) of 'name(a,b) trailer'."""
    name, _, rest = description.partition("(")
    depth = 1
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return name, _split_args(rest[:i]), rest[i + 1 :].strip()
    return name, _split_args(rest), ""


def _named(kind: str, args: list[str], source: bool) -> dict[str, str]:
    if source:
        return {a.partition("=")[0]: a.partition("=")[2] for a in args}
    names = _DESCRIBED_ARGS.get(kind, ())
    return {names[i] if i < len(names) else f"argument {i + 1}": a for i, a in enumerate(args)}


def _differences(saved: str, current: str, source: bool) -> list[str]:
    kind, saved_args, saved_tail = _parse(saved)
    now_kind, now_args, now_tail = _parse(current)
    if kind != now_kind:
        return [f"was {kind}(), now {now_kind}()"]
    before, after = _named(kind, saved_args, source), _named(kind, now_args, source)
    out = []
    for name in [*before, *(n for n in after if n not in before)]:
        if before.get(name) != after.get(name):
            out.append(f"{name} differs (saved {before.get(name, 'unset')}, now {after.get(name, 'unset')})")
    if saved_tail != now_tail:
        fields = dict(p.split("=", 1) for p in saved_tail.split() if "=" in p)
        now = dict(p.split("=", 1) for p in now_tail.split() if "=" in p)
        if fields.get("shards") != now.get("shards"):
            out.append(
                f"the shard list differs (saved {fields.get('shards')} shards, now {now.get('shards')})"
            )
        elif fields.get("urls") != now.get("urls"):
            out.append(f"the shard URLs differ (same count, {fields.get('shards')})")
        elif fields.get("members") != now.get("members"):
            out.append(f"the mixed datasets differ (saved {fields.get('members')}, now {now.get('members')})")
        else:
            out.append("a mixed dataset's own source or stages differ")
    return out or [f"saved {saved!r}, now {current!r}"]


def describe_mismatch(saved: Sequence[str], current: Sequence[str]) -> str:
    """What differs between the pipeline a state was taken from and this one, naming stage and argument.

    Args:
        saved: The state's per-part descriptions (`short_descriptions` when the state was taken).
        current: The same for this pipeline.

    Example:
        >>> describe_mismatch(["tars() shards=2 urls=ab", "shuffle(7,None,None)"],
        ...                   ["tars() shards=2 urls=ab", "shuffle(8,None,None)"])
        'stage 1 shuffle(): buffer_size differs (saved 7, now 8)'
    """
    problems: list[str] = []
    for i, (old, new) in enumerate(zip(saved, current, strict=False)):
        if old == new:
            continue
        kind = _parse(new)[0]
        where = "the source" if i == 0 else "the loader" if kind == "loader" else f"stage {i} {kind}()"
        problems += [f"{where}: {d}" for d in _differences(old, new, source=i == 0)]
    if len(saved) > len(current):
        dropped = ", ".join(_parse(d)[0] + "()" for d in saved[len(current) :])
        problems.append(f"the state's pipeline has {len(saved) - len(current)} more stage(s): {dropped}")
    elif len(current) > len(saved):
        added = ", ".join(_parse(d)[0] + "()" for d in current[len(saved) :])
        problems.append(f"this pipeline has {len(current) - len(saved)} more stage(s): {added}")
    return "; ".join(problems) if problems else "the pipelines describe the same (the fingerprints differ)"


def mismatch_message(state: object, current: Sequence[str]) -> str:
    """The refusal's detail for a state that may or may not carry descriptions (older states do not)."""
    saved = state.get("stages") if isinstance(state, dict) else None
    if not isinstance(saved, list) or not all(isinstance(s, str) for s in saved):
        return "the state carries no stage descriptions (taken by an older version)"
    return describe_mismatch(saved, current)


class IdentityViews(TypedDict):
    """mvp-dataset's identity keys of a state (`identity_views`): views of its descriptions."""

    source: dict[str, str] | None  # the source's options, kind, description and source_fingerprint
    stages: list[dict[str, str]]  # each dataset stage's kind and description
    loader: dict[str, object] | None  # a TorchLoader's kind, description and stages


def identity_views(parts: Sequence[str]) -> IdentityViews:
    """mvp-dataset's identity keys, read from a state's short descriptions (`short_descriptions`): the
    ``source`` (its kind, options and a ``source_fingerprint``), the dataset's ``stages`` and the ``loader``
    (its batching and stages; None for a Dataset's state), each stage as ``{"kind", "description"}``.

    Views only: they follow from the descriptions, which the fingerprint covers; a state whose views were
    edited is refused ([ResumeIdentityMismatch], `shardcache.resume.state.check_identity`).
    """
    if not parts:
        return {"source": None, "stages": [], "loader": None}
    head = parts[0]
    kind, args, _ = _parse(head)
    options: dict[str, str] = {}
    for name, text in _named(kind, args, source=True).items():
        options[name] = _value(text)
    source = {
        **options,
        "kind": kind,
        "description": head,
        "source_fingerprint": hashlib.sha256(head.encode()).hexdigest()[:32],
    }
    rest = list(parts[1:])
    at = next((i for i, part in enumerate(rest) if _parse(part)[0] == "loader"), None)
    dataset_stages = rest if at is None else rest[:at]
    loader: dict[str, object] | None = None
    if at is not None:
        loader = {
            "kind": "torch_loader",
            "description": rest[at],
            "stages": [_stage_view(part) for part in rest[at + 1 :]],
        }
    return {"source": source, "stages": [_stage_view(part) for part in dataset_stages], "loader": loader}


# Our stage kinds under mvp-dataset's names, in the identity views: mvp-dataset builds resolve_ref() as an
# assemble stage, so code reading its identities finds "assemble" there.
_MVP_KIND = {"resolve_ref": "assemble"}


def _stage_view(description: str) -> dict[str, str]:
    kind = _parse(description)[0]
    return {"kind": _MVP_KIND.get(kind, kind), "description": description}


def _value(text: str) -> str:
    """An option's value as written in a description (a Python repr): the string itself for strings."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text
