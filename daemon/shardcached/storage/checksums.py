"""Checksums as opens and manifests give them: `'<algorithm>:<hex digest>'`, e.g. `'sha256:ab12…'`."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shardcached.errors import BadRequest


def parse_checksum(checksum: str) -> tuple[str, str]:
    """`('sha256', 'ab12…')` from `'sha256:ab12…'`.

    Raises:
        BadRequest: not `<algo>:<hex>` or an algorithm hashlib does not know.
    """
    algo, sep, digest = checksum.partition(":")
    algo = algo.lower().replace("-", "")
    if not sep or not digest or algo not in hashlib.algorithms_available:
        raise BadRequest(
            f"invalid checksum {checksum!r}: use '<algorithm>:<hex digest>', e.g. 'sha256:…' "
            f"(algorithms: sha256, sha1, md5, blake2b, ...)",
            code="bad_checksum",
        )
    return algo, digest.lower()


def normalize_checksum(checksum: str) -> str:
    """`'sha256:ab12…'` spelt one way (algorithm and digest lower-case): equal checksums compare equal."""
    algo, digest = parse_checksum(checksum)
    return f"{algo}:{digest}"


def file_matches(path: Path, checksum: str) -> bool:
    """Whether the file's digest is `checksum` (blocking: run it in a worker thread)."""
    algo, digest = parse_checksum(checksum)
    with open(path, "rb", buffering=0) as src:
        return hashlib.file_digest(src, algo).hexdigest() == digest
