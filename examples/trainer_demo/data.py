"""The trainer demo's dataset: generated image-and-label tar shards, uploaded to an S3 endpoint.

Each sample is a `.npy` member (a 64x64 RGB uint8 "image" of seeded noise, tinted by its class)
and a `.json` member (`{"label": k}`), the layout WebDataset and our tars source read. Generation is seeded,
so two runs produce the same bytes (and the same S3 ETags).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IMAGE_SHAPE = (64, 64, 3)
CLASSES = 10
# Bytes one sample occupies in a tar: .npy (header + pixels) and .json, each padded, plus two headers.
_NPY_BYTES = 128 + int(np.prod(IMAGE_SHAPE))
SAMPLE_TAR_BYTES = 512 + -(-_NPY_BYTES // 512) * 512 + 512 + 512


@dataclass(frozen=True)
class DemoDataset:
    """Shard URLs of the two splits, and what they add up to."""

    train: tuple[str, ...]
    val: tuple[str, ...]
    total_bytes: int
    samples: int  # train samples (0 when unknown, e.g. a user's bucket)

    @property
    def urls(self) -> tuple[str, ...]:
        return self.train + self.val


def samples_per_shard(shard_bytes: int) -> int:
    return max(1, shard_bytes // SAMPLE_TAR_BYTES)


def make_shard(index: int, samples: int, seed: int = 0) -> bytes:
    """One tar shard of `samples` image/label pairs, deterministic in (seed, index)."""
    rng = np.random.default_rng([seed, index])
    labels = rng.integers(0, CLASSES, size=samples)
    # One draw for the whole shard and one .npy header for every image: generating the default dataset
    # sample by sample took minutes on a 2-core machine.
    images = np.frombuffer(rng.bytes(samples * int(np.prod(IMAGE_SHAPE))), dtype=np.uint8)
    images = (images.reshape(samples, *IMAGE_SHAPE) // 2).copy()
    for channel in range(3):
        images[..., channel] += (5 * labels * (labels % 3 == channel)).astype(np.uint8)[:, None, None]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": IMAGE_SHAPE}
    )
    npy_header = header.getvalue()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, label in enumerate(labels):
            key = f"img_{index:06d}_{i:05d}"
            npy = npy_header + images[i].tobytes()
            for suffix, data in ((".npy", npy), (".json", b'{"label": %d}' % int(label))):
                info = tarfile.TarInfo(key + suffix)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(
    endpoint: str, credentials: dict[str, str], bucket: str, shards: int, val_shards: int, shard_bytes: int
) -> DemoDataset:
    """Create `bucket` and upload `shards` training and `val_shards` validation shards to it."""
    try:
        import boto3
    except ImportError as exc:
        raise SystemExit("the demo needs boto3: pip install 'shardcache[demo]' (or run `make demo`)") from exc
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
    )
    s3.create_bucket(Bucket=bucket)
    per_shard = samples_per_shard(shard_bytes)
    total = 0
    splits: dict[str, list[str]] = {"train": [], "val": []}
    for index in range(shards + val_shards):
        split = "train" if index < shards else "val"
        body = make_shard(index, per_shard)
        key = f"{split}/shard_{index:06d}.tar"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        splits[split].append(f"s3://{bucket}/{key}")
        total += len(body)
    return DemoDataset(tuple(splits["train"]), tuple(splits["val"]), total, shards * per_shard)


def describe_user_shards(pattern: str | Sequence[str], val_shards: int) -> DemoDataset:
    """A user's shards (brace ranges, globs, a manifest): the last `val_shards` become the validation split.

    Raises:
        ConfigError: the pattern expands to too few shards for the split.
    """
    import fsspec

    from shardcache.errors import ConfigError
    from shardcache.shards import expand_shards

    refs = expand_shards(pattern, data_suffix=".tar")
    urls = [ref.url for ref in refs]
    if len(urls) <= val_shards:
        raise ConfigError(
            f"--shards {pattern}: {len(urls)} shard(s) found; the demo needs more than --val-shards "
            f"({val_shards}); give more shards or --val-shards 0"
        )
    total = 0
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        total += int(fs.size(path))
    split = len(urls) - val_shards
    return DemoDataset(tuple(urls[:split]), tuple(urls[split:]), total, 0)
