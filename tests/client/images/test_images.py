"""shardcache.images: decode fused with the crop, the same crops whichever backend decodes, DCT scaling,
compressed records decoded by batch, corrupt images named, and a real pipeline with DataLoader workers."""

from __future__ import annotations

import hashlib
import io
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("simplejpeg")
torch = pytest.importorskip("torch")

from PIL import Image  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from harness.pipelines import assert_resumes, write_tar  # noqa: E402
from shardcache import Dataset, RuntimeContext, TorchLoader, images  # noqa: E402
from shardcache.errors import ConfigError, CorruptImageError, CorruptShardError  # noqa: E402
from shardcache.images import codecs  # noqa: E402
from shardcache.images.crop import CropBox, random_resized_box, sample_rng  # noqa: E402

FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}


def picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with noise: something a codec has to work on, unlike a flat colour."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 255 / (width + height)], axis=-1)
    noise = np.random.default_rng(seed).normal(0, 6, (height, width, 3))
    return np.asarray((base + noise).clip(0, 255), dtype=np.uint8)


def encode(array: np.ndarray, ext: str = "jpg", **options: Any) -> bytes:
    out = io.BytesIO()
    params = {"quality": 90} if ext in ("jpg", "webp") else {}
    Image.fromarray(array).save(out, FORMATS[ext], **{**params, **options})
    return out.getvalue()


def sample(data: bytes, key: str = "s000_0000", ext: str = "jpg") -> dict[str, Any]:
    return {"__key__": key, "__shard__": "/data/shard_000000.tar", ext: data}


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return encode(picture(500, 375))


# -- decoding ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "pil", "turbo"])
def test_decode_gives_an_hwc_uint8_crop_of_the_requested_size(jpeg: bytes, backend: str) -> None:
    out = images.decode("jpg", size=(160, 224), backend=backend, seed=1)(sample(jpeg))["jpg"]
    assert out.shape == (160, 224, 3) and out.dtype == np.uint8


@pytest.mark.parametrize("crop", ["random_resized", "center", "none"])
def test_turbo_pixels_are_close_to_the_pillow_reference(jpeg: bytes, crop: str) -> None:
    # A 224 output from crops of 500x375 takes the DCT-scaled path for "none" (2x smaller is allowed only
    # when the box is at least 448 wide and tall: not here), so also check a small output that does scale.
    for size in (224, 64):
        ref = images.decode("jpg", size, crop=crop, backend="pil", seed=3)(sample(jpeg))["jpg"]
        fast = images.decode("jpg", size, crop=crop, backend="turbo", seed=3)(sample(jpeg))["jpg"]
        assert mean_abs_diff(ref, fast) < 3.0, (size, crop)


@pytest.mark.parametrize("ext", ["png", "webp"])
def test_png_and_webp_go_through_the_same_call_on_every_backend(ext: str) -> None:
    data = encode(picture(320, 240), ext)
    outs = [images.decode(ext, 96, backend=b, seed=0)(sample(data, ext=ext))[ext] for b in images.BACKENDS]
    assert all(o.shape == (96, 96, 3) for o in outs)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])  # non-JPEGs: Pillow whatever the backend


def test_grayscale_and_rgba_images_come_out_rgb() -> None:
    gray = encode(picture(200, 150)[..., 0], "jpg")
    rgba = encode(np.dstack([picture(200, 150), np.full((150, 200), 128, np.uint8)]), "png")
    assert images.decode("jpg", 32, backend="turbo")(sample(gray))["jpg"].shape == (32, 32, 3)
    assert images.decode("png", 32)(sample(rgba, ext="png"))["png"].shape == (32, 32, 3)


def test_the_pillow_draft_option_stays_close_to_the_plain_reference(jpeg: bytes) -> None:
    plain = images.decode("jpg", 64, crop="none", backend="pil")(sample(jpeg))["jpg"]
    draft = images.decode("jpg", 64, crop="none", backend="pil", draft=True)(sample(jpeg))["jpg"]
    assert mean_abs_diff(plain, draft) < 3.0


# -- crop parameters -----------------------------------------------------------------------------------------


def test_crop_boxes_are_identical_whichever_backend_decodes(jpeg: bytes) -> None:
    for key in [f"s000_{i:04d}" for i in range(20)]:
        boxes = {
            images.decode("jpg", 224, backend=b, seed=7, defer=True)(sample(jpeg, key))["jpg"].box
            for b in images.BACKENDS
        }
        assert boxes == {random_resized_box(500, 375, sample_rng(7, key))}


def test_crops_depend_on_seed_key_and_epoch_only() -> None:
    box = random_resized_box(500, 375, sample_rng(1, "a", 0))
    assert box == random_resized_box(500, 375, sample_rng(1, "a", 0))
    others = [sample_rng(2, "a", 0), sample_rng(1, "b", 0), sample_rng(1, "a", 1)]
    assert all(random_resized_box(500, 375, rng) != box for rng in others)


def test_random_resized_boxes_keep_torchvision_scale_and_ratio_bounds() -> None:
    for i in range(500):
        box = random_resized_box(500, 375, sample_rng(0, str(i)), scale=(0.2, 0.5), ratio=(0.75, 1.33))
        assert 0 <= box.top and box.top + box.height <= 375 and 0 <= box.left and box.left + box.width <= 500
        # rounding the sides moves area and ratio a little past the drawn ones
        assert 0.19 <= box.height * box.width / (500 * 375) <= 0.51
        assert 0.74 <= box.width / box.height <= 1.35


def test_an_image_no_draw_fits_falls_back_to_the_central_crop_in_the_ratio_range() -> None:
    # 1000 x 10: every drawn box is taller than the image, so after 10 draws the central fallback applies.
    box = random_resized_box(1000, 10, sample_rng(0, "wide"))
    assert box == CropBox(top=0, left=(1000 - 13) // 2, height=10, width=13)


# -- DCT scaling ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("box", "size", "factor"),
    [
        (CropBox(0, 0, 375, 500), (224, 224), 1),  # target more than half the box: full-scale decode
        (CropBox(0, 0, 375, 500), (187, 250), 2),
        (CropBox(0, 0, 375, 500), (93, 93), 4),
        (CropBox(0, 0, 375, 500), (32, 32), 8),
        (CropBox(0, 0, 375, 100), (32, 32), 2),  # the narrow side decides
    ],
)
def test_turbo_decodes_at_the_largest_dct_scale_the_box_allows(
    jpeg: bytes, box: CropBox, size: tuple[int, int], factor: int
) -> None:
    header = codecs.read_header(jpeg, use_turbo=True)
    decoded = codecs.decode_turbo(jpeg, header, box, size)
    assert decoded.decoded_size == (-(-375 // factor), -(-500 // factor))
    assert decoded.image.shape == (*size, 3)


def test_pillow_reference_decodes_at_full_size_and_draft_scales(jpeg: bytes) -> None:
    box = CropBox(0, 0, 375, 500)
    plain = codecs.decode_pil(jpeg, codecs.read_header(jpeg, use_turbo=False), box, (32, 32))
    draft = codecs.decode_pil(jpeg, codecs.read_header(jpeg, use_turbo=False), box, (32, 32), draft=True)
    assert plain.decoded_size == (375, 500) and draft.decoded_size == (47, 63)


# -- deferred records and the batch decode -------------------------------------------------------------------


def batch_of(n: int) -> list[dict[str, Any]]:
    return [sample(encode(picture(500, 375, seed=i)), f"s000_{i:04d}") for i in range(n)]


@pytest.mark.parametrize("backend", ["pil", "turbo"])
def test_a_collated_deferred_batch_decodes_to_the_eager_batch(backend: str) -> None:
    samples = batch_of(4)
    eager = default_collate([images.decode("jpg", 96, backend=backend, seed=5)(s) for s in samples])
    deferred = default_collate(
        [images.decode("jpg", 96, backend=backend, seed=5, defer=True)(s) for s in samples]
    )
    assert isinstance(deferred["jpg"], images.DeferredImage)
    decoded = images.decode_batch(deferred["jpg"], backend=backend)
    assert decoded.dtype == torch.uint8 and torch.equal(decoded, eager["jpg"])


def test_a_list_of_deferred_records_decodes_like_its_collated_form() -> None:
    records = [images.decode("jpg", 64, seed=0, defer=True)(s)["jpg"] for s in batch_of(3)]
    assert torch.equal(images.decode_batch(records), images.decode_batch(default_collate(records)))


def test_a_deferred_record_pickles_far_smaller_than_its_pixels(jpeg: bytes) -> None:
    record = images.decode("jpg", 224, seed=0, defer=True)(sample(jpeg))["jpg"]
    pixels = images.decode("jpg", 224, seed=0)(sample(jpeg))["jpg"]
    assert len(pickle.dumps(record)) < len(pickle.dumps(pixels)) / 2


def test_decode_ahead_yields_every_batch_decoded_in_order() -> None:
    samples = batch_of(6)
    deferred = [
        default_collate([images.decode("jpg", 32, seed=1, defer=True)(s) for s in samples[i : i + 2]])
        for i in range(0, 6, 2)
    ]
    eager = [
        default_collate([images.decode("jpg", 32, seed=1)(s) for s in samples[i : i + 2]])
        for i in range(0, 6, 2)
    ]
    got = list(images.decode_ahead(iter(deferred), "jpg", depth=2, device="cpu"))
    assert [b["__key__"] for b in got] == [b["__key__"] for b in eager]
    assert all(torch.equal(g["jpg"], e["jpg"]) for g, e in zip(got, eager, strict=True))


def test_the_gpu_device_without_cuda_is_a_config_error_and_auto_falls_back_to_the_cpu() -> None:
    record = images.decode("jpg", 32, seed=0, defer=True)(batch_of(1)[0])["jpg"]
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="device='cuda'"):
        images.decode_batch([record], device="cuda")
    assert images.decode_batch([record], device="auto").device.type == "cpu"


# -- errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["pil", "turbo"])
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_image_raises_an_error_naming_shard_key_and_field(
    jpeg: bytes, backend: str, damage: str
) -> None:
    data = jpeg[: len(jpeg) // 2] if damage == "truncated" else b"\xff\xd8\xff" + b"not a jpeg" * 10
    with pytest.raises(CorruptImageError) as info:
        images.decode("jpg", 64, backend=backend)(sample(data, "s003_0042"))
    assert isinstance(info.value, CorruptShardError)
    assert info.value.key == "s003_0042" and info.value.field == "jpg"
    assert "s003_0042" in str(info.value) and "/data/shard_000000.tar" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).key == "s003_0042"  # crosses DataLoader workers


def test_a_missing_field_is_a_config_error_listing_the_fields(jpeg: bytes) -> None:
    with pytest.raises(ConfigError, match=r"no field 'png'.*\['jpg'\]"):
        images.decode("png")(sample(jpeg))


@pytest.mark.parametrize(
    "kwargs", [{"backend": "cv2"}, {"crop": "random"}, {"on_error": "ignore"}, {"scale": (0.5, 0.1)}]
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        images.decode("jpg", **kwargs)


def test_without_pillow_decode_names_the_images_extra(tmp_path: Path) -> None:
    from tests.client.test_missing_extras import one_line_naming, run_without

    code = """
        import sys
        from shardcache import images
        from shardcache.errors import ConfigError
        try:
            images.decode("jpg")
        except ConfigError as exc:
            sys.exit(str(exc))
    """
    one_line_naming(run_without(["PIL"], code, tmp_path), "images")


def test_turbo_without_simplejpeg_names_the_images_extra_and_auto_uses_pillow(tmp_path: Path) -> None:
    from tests.client.test_missing_extras import one_line_naming, run_without

    code = """
        import sys
        from shardcache import images
        from shardcache.errors import ConfigError
        assert not images.decode("jpg").use_turbo
        try:
            images.decode("jpg", backend="turbo")
        except ConfigError as exc:
            sys.exit(str(exc))
    """
    one_line_naming(run_without(["simplejpeg"], code, tmp_path), "images")


# -- in a pipeline -------------------------------------------------------------------------------------------


@pytest.fixture
def image_tars(tmp_path: Path) -> list[str]:
    """4 shards of 6 samples; each shard holds a JPEG, a PNG and a WebP per sample, of varied sizes."""
    paths = []
    for s in range(4):
        members = []
        for i in range(6):
            array = picture(160 + 40 * i, 120 + 20 * s, seed=10 * s + i)
            for ext in FORMATS:
                members.append((f"s{s:03d}_{i:04d}.{ext}", encode(array, ext)))
        paths.append(str(write_tar(tmp_path / f"img_{s:06d}.tar", members)))
    return paths


def by_key(batches: list[dict[str, Any]], field: str) -> dict[str, np.ndarray]:
    return {k: b[field][i].numpy() for b in batches for i, k in enumerate(b["__key__"])}


@pytest.mark.parametrize("workers", ["processes", "threads"])
def test_a_pipeline_with_dataloader_workers_decodes_every_format_end_to_end(
    image_tars: list[str], workers: str
) -> None:
    ds = Dataset.from_source("tars", image_tars, daemon=None)
    for ext in FORMATS:
        ds = ds.map(images.decode(ext, 48, seed=0))
    ds = ds.select(list(FORMATS))
    batches = list(TorchLoader(ds, num_workers=2, batch_size=4, workers=workers))
    assert sum(len(b["__key__"]) for b in batches) == 24
    assert all(
        b[ext].shape[1:] == (48, 48, 3) and b[ext].dtype == torch.uint8 for b in batches for ext in FORMATS
    )
    # Workers draw the same crops as a single process: the crop is a function of (seed, key).
    alone = {s["__key__"]: s["jpg"] for s in ds}
    assert all(np.array_equal(v, alone[k]) for k, v in by_key(batches, "jpg").items())


def test_each_epoch_crops_change_with_the_epoch_and_not_with_the_workers(image_tars: list[str]) -> None:
    decoder = images.decode("jpg", 32, seed=3)
    ds = Dataset.from_source("tars", image_tars, daemon=None).assemble(decoder.each_epoch).select(["jpg"])

    def epoch(e: int, workers: int) -> dict[str, np.ndarray]:
        ds.set_epoch(e)
        return by_key(
            list(TorchLoader(ds, num_workers=workers, batch_size=4, persistent_workers=False)), "jpg"
        )

    first, again, second = epoch(0, 2), epoch(0, 0), epoch(1, 2)
    assert first.keys() == again.keys() == second.keys()
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert sum(not np.array_equal(first[k], second[k]) for k in first) > len(first) // 2


def test_each_epoch_crops_change_across_passes_of_persistent_workers(image_tars: list[str]) -> None:
    decoder = images.decode("jpg", 32, seed=3)
    ds = Dataset.from_source("tars", image_tars, daemon=None).assemble(decoder.each_epoch).select(["jpg"])
    loader = TorchLoader(ds, num_workers=2, batch_size=4)  # persistent workers; each pass the next epoch
    first, second = by_key(list(loader), "jpg"), by_key(list(loader), "jpg")
    loader.close()
    assert first.keys() == second.keys()
    assert sum(not np.array_equal(first[k], second[k]) for k in first) > len(first) // 2


def test_on_error_skip_drops_undecodable_samples_under_each_epoch(tmp_path: Path) -> None:
    good = encode(picture(100, 80))
    members = [(f"k{i}.jpg", good if i != 2 else good[:200]) for i in range(5)]
    shard = str(write_tar(tmp_path / "mixed.tar", members))
    skipping = images.decode("jpg", 16, on_error="skip")
    ds = Dataset.from_source("tars", [shard], daemon=None)
    assert sorted(s["__key__"] for s in ds.assemble(skipping.each_epoch)) == ["k0", "k1", "k3", "k4"]
    with pytest.raises(CorruptImageError, match="'k2'"):
        list(ds.map(images.decode("jpg", 16)))


def test_workers_ship_compressed_records_and_the_main_process_decodes_ahead(image_tars: list[str]) -> None:
    ds = Dataset.from_source("tars", image_tars, daemon=None).select(["jpg"])
    eager = by_key(
        list(TorchLoader(ds.map(images.decode("jpg", 40, seed=2)), num_workers=2, batch_size=4)), "jpg"
    )
    loader = TorchLoader(ds.map(images.decode("jpg", 40, seed=2, defer=True)), num_workers=2, batch_size=4)
    decoded = by_key(list(images.decode_ahead(loader, "jpg", device="cpu")), "jpg")
    assert decoded.keys() == eager.keys() and all(np.array_equal(decoded[k], eager[k]) for k in eager)


def test_a_corrupt_image_in_a_worker_reaches_the_trainer_as_corrupt_image_error(tmp_path: Path) -> None:
    good = encode(picture(100, 80))
    shard = str(write_tar(tmp_path / "bad.tar", [("k0.jpg", good), ("k1.jpg", b"\xff\xd8\xffjunk")]))
    ds = Dataset.from_source("tars", [shard], daemon=None).map(images.decode("jpg", 16))
    with pytest.raises(CorruptImageError, match="'k1'"):
        list(TorchLoader(ds, num_workers=1, batch_size=None))


def digest(sample: dict[str, Any]) -> dict[str, Any]:
    return {"__key__": sample["__key__"], "jpg": hashlib.sha256(sample["jpg"].tobytes()).hexdigest()}


def test_each_epoch_decoding_resumes_exactly(image_tars: list[str]) -> None:
    def make() -> Dataset:
        source = Dataset.from_source("tars", image_tars, daemon=None)
        return source.assemble(images.decode("jpg", 24, seed=1).each_epoch).map(digest)

    assert_resumes(make, [0, 5, 13], RuntimeContext(seed=0, epoch=1))


def test_decoding_in_a_forked_worker_imports_nothing_the_builder_did_not(tmp_path: Path) -> None:
    """What a worker's decode needs is imported when the stage is built (shardcache.forksafe, rule 1)."""
    for ext in FORMATS:
        (tmp_path / f"image.{ext}").write_bytes(encode(picture(64, 48), ext))
    code = f"""
        import sys
        from pathlib import Path
        from shardcache import images
        decoders = {{ext: images.decode(ext, 16) for ext in {list(FORMATS)!r}}}
        before = set(sys.modules)
        for ext, decoder in decoders.items():
            decoder({{"__key__": "k", ext: Path({str(tmp_path)!r}, "image." + ext).read_bytes()}})
        print(sorted(set(sys.modules) - before))
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
