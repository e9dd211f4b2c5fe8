"""The hand-written tar reader against Python's tarfile: formats, long names, truncation, streaming."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from harness.pipelines import write_tar
from shardcache.errors import CorruptShardError
from shardcache.sources.tarfmt import (
    OFFSET_EVERY,
    iter_members,
    iter_members_stream,
    iter_tar_samples,
    iter_tar_samples_stream,
    sample_index,
    sample_offset,
    split_key,
)

LONG = "d/" + "x" * 150 + "/k1.txt"


def members_by_tarfile(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]  # type: ignore[union-attr]


def members_by_ours(path: Path) -> list[tuple[str, bytes]]:
    data = path.read_bytes()
    return [(name, data[o : o + s]) for name, o, s in iter_members(data, str(path))]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_match_tarfile_for_each_format(tmp_path: Path, fmt: int) -> None:
    names = [("a.txt", b"1"), ("b.bin", b"x" * 1000), ("p" * 90 + "/" + "y" * 60 + ".txt", b"prefixed")]
    if fmt != tarfile.USTAR_FORMAT:
        names.append((LONG, b"very long"))
        names.append(("ünï.txt", b"utf8"))
    path = write_tar(tmp_path / "t.tar", names, fmt)
    assert members_by_ours(path) == members_by_tarfile(path)


def test_directories_and_links_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w") as tar:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        link = tarfile.TarInfo("dir/l.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "x"
        tar.addfile(link)
        f = tarfile.TarInfo("dir/k.txt")
        f.size = 2
        tar.addfile(f, io.BytesIO(b"ok"))
    assert members_by_ours(path) == [("dir/k.txt", b"ok")]


def test_samples_group_members_by_key(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.txt", b"1"), ("a.json", b"{}"), ("b.txt", b"2")])
    samples = list(iter_tar_samples(path.read_bytes(), "u"))
    assert samples == [
        {"__key__": "a", "__shard__": "u", "__index_in_shard__": 0, "txt": b"1", "json": b"{}"},
        {"__key__": "b", "__shard__": "u", "__index_in_shard__": 1, "txt": b"2"},
    ]


def test_stream_reader_yields_the_same_samples(tmp_path: Path) -> None:
    path = write_tar(
        tmp_path / "t.tar", [(f"k{i}.txt", bytes([i]) * (i * 37)) for i in range(20)], tarfile.PAX_FORMAT
    )
    with open(path, "rb") as f:
        streamed = list(iter_tar_samples_stream(f, "u"))
    assert streamed == list(iter_tar_samples(path.read_bytes(), "u"))


@pytest.mark.parametrize("cut", [700, 1500])
def test_truncated_shard_names_shard_and_member(tmp_path: Path, cut: int) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.txt", b"x" * 600), ("b.txt", b"y" * 600)])
    data = path.read_bytes()[:cut]
    with pytest.raises(CorruptShardError) as err:
        list(iter_tar_samples(data, "s3://b/t.tar"))
    assert "s3://b/t.tar" in str(err.value)
    assert err.value.member is not None
    with pytest.raises(CorruptShardError):
        list(iter_tar_samples_stream(io.BytesIO(data), "s3://b/t.tar"))


def test_garbage_header_is_corrupt(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.txt", b"x")])
    data = bytearray(path.read_bytes())
    data[1024:1536] = b"\x07" * 512
    with pytest.raises(CorruptShardError, match="invalid tar header"):
        list(iter_tar_samples(bytes(data), "t.tar"))


@pytest.mark.parametrize("reader", ["mmap", "stream"])
def test_header_with_valid_magic_but_a_wrong_checksum_is_corrupt_naming_the_shard(
    tmp_path: Path, reader: str
) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.txt", b"x"), ("b.txt", b"y")])
    data = bytearray(path.read_bytes())
    assert data[1024 + 257 : 1024 + 262] == b"ustar"
    data[1024] ^= 0x01  # "b.txt" becomes "c.txt"; the magic stays, the checksum no longer matches
    with pytest.raises(CorruptShardError, match="checksum") as err:
        if reader == "mmap":
            list(iter_members(bytes(data), "s3://b/t.tar"))
        else:
            list(iter_members_stream(io.BytesIO(bytes(data)), "s3://b/t.tar"))
    assert "s3://b/t.tar" in str(err.value)
    assert err.value.member == "after a.txt"


def test_header_checksummed_over_signed_bytes_is_accepted(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", [("é.txt", b"x")], tarfile.USTAR_FORMAT)
    data = bytearray(path.read_bytes())
    header = data[:512]
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + 8 * 32
    data[148:156] = b"%06o\0 " % signed
    assert [name for name, _, _ in iter_members(bytes(data), "t.tar")] == ["é.txt"]


@pytest.mark.parametrize("record", [b"0 path=a.txt\n", b"x7 path=a\n", b"20 size=many\n"])
@pytest.mark.timeout(30)
def test_malformed_pax_header_is_corrupt_in_both_readers(tmp_path: Path, record: bytes) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        pax = tarfile.TarInfo("pax_header")
        pax.type, pax.size = tarfile.XHDTYPE, len(record)
        tar.addfile(pax, io.BytesIO(record))
        member = tarfile.TarInfo("a.txt")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    data = buffer.getvalue()
    with pytest.raises(CorruptShardError, match="malformed pax header"):
        list(iter_tar_samples(data, "t.tar"))
    with pytest.raises(CorruptShardError, match="malformed pax header"):
        list(iter_tar_samples_stream(io.BytesIO(data), "t.tar"))


def test_key_dot_level_splits_key_and_field() -> None:
    assert split_key("abc.extra.jpg", 1) == ("abc", "extra.jpg")
    assert split_key("dir/abc.extra.jpg", 2) == ("abc.extra", "jpg")
    assert split_key("noext", 1) is None
    assert split_key("__meta__", 1) is None


def _mixed_members() -> list[tuple[str, bytes]]:
    members: list[tuple[str, bytes]] = [("__meta__.json", b"{}")]
    for i in range(12):
        members += [
            (f"dir/s{i:02d}.jpg", bytes([i]) * (100 + 600 * (i % 3))),
            (f"dir/s{i:02d}.cls", b"%d" % i),
        ]
        if i == 5:
            members.append(("dir/nokey", b"ignored"))  # no field: not part of any sample
    return members


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("start", [0, 1, 5, 6, 11, 12, 20])
def test_samples_from_a_start_index_match_skipping_by_parsing(tmp_path: Path, fmt: int, start: int) -> None:
    path = write_tar(tmp_path / "t.tar", _mixed_members(), fmt)
    data = path.read_bytes()
    everything = list(iter_tar_samples(data, "t.tar"))
    assert list(iter_tar_samples(data, "t.tar", start=start)) == everything[start:]


def test_header_walk_finds_the_start_of_a_sample_without_parsing_samples(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", _mixed_members())
    data = path.read_bytes()
    third = list(iter_tar_samples(data, "t.tar"))[3]["__key__"]
    offset = sample_offset(data, "t.tar", 3)
    assert offset is not None
    assert data[offset : offset + 7] == b"dir/" + str(third).encode()


def test_a_corrupt_header_before_the_start_still_fails_the_read(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", _mixed_members())
    data = bytearray(path.read_bytes())
    header = data.index(b"dir/s04.jpg")
    data[header + 130] ^= 0x01  # that header's size field: its checksum no longer matches
    assert sample_offset(bytes(data), "t.tar", 8) is None
    with pytest.raises(CorruptShardError, match="t.tar"):
        list(iter_tar_samples(bytes(data), "t.tar", start=8))


def _many_samples(n: int) -> list[tuple[str, bytes]]:
    return [m for i in range(n) for m in ((f"k{i:04d}.bin", b"x" * (i % 700)), (f"k{i:04d}.cls", b"%d" % i))]


def test_sample_index_records_the_start_of_every_nth_sample(tmp_path: Path) -> None:
    data = write_tar(tmp_path / "t.tar", _many_samples(150)).read_bytes()
    index = sample_index(data)
    assert index is not None
    count, offsets = index
    assert count == 150
    assert len(offsets) == 3  # samples 0, 64 and 128
    for k, offset in enumerate(offsets):
        assert data[offset : offset + 5] == b"k%04d" % (k * OFFSET_EVERY)


@pytest.mark.parametrize("start", [1, 63, 64, 65, 130, 149])
def test_recorded_offsets_give_the_same_samples_as_walking_from_the_start(tmp_path: Path, start: int) -> None:
    data = write_tar(tmp_path / "t.tar", _many_samples(150)).read_bytes()
    index = sample_index(data)
    assert index is not None
    everything = list(iter_tar_samples(data, "t.tar"))
    assert list(iter_tar_samples(data, "t.tar", start=start, offsets=index[1])) == everything[start:]


def test_an_offset_that_lands_off_a_header_falls_back_to_parsing(tmp_path: Path) -> None:
    data = write_tar(tmp_path / "t.tar", _many_samples(150)).read_bytes()
    everything = list(iter_tar_samples(data, "t.tar"))
    wrong = (0, 700, 1400)  # not where samples 64 and 128 start: the walk's checksum check refuses them
    assert sample_offset(data, "t.tar", 100, offsets=wrong) is None
    assert list(iter_tar_samples(data, "t.tar", start=100, offsets=wrong)) == everything[100:]
