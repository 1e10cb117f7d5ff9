"""The audit reads an output shard once: its tar walk served from chunks that are hashed as they are read
(`filedigest.HashedReads`). The walk must see exactly the bytes `os.pread` gives, and the digest must be the
file's (`file_digest`), whatever the chunk boundaries cut (headers, payloads, members larger than a chunk)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from pack_assets.core import audit, filedigest


def _shard(path, sizes: list[int]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, n in enumerate(sizes):
            # a long name now and then: a PAX header before the member, read through the same reads
            name = f"{i:06d}{'x' * 120 if i % 3 == 0 else ''}.{'json' if i % 2 else 'jpg'}"
            info = tarfile.TarInfo(name)
            info.size = n
            tf.addfile(info, io.BytesIO(bytes((i * 7 + k) % 251 for k in range(n))))


@pytest.mark.parametrize("chunk", [512, 1000, 4096, 1 << 20])
def test_one_read_gives_the_walk_and_the_file_digest(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(filedigest, "CHUNK", chunk)
    path = tmp_path / "s.tar"
    _shard(path, [0, 1, 511, 512, 513, 3000, 5000, 100, 9000, 7, 4096])
    plain = list(audit._pack_parts(path))
    hashed = filedigest.HashedReads()
    assert list(audit._pack_parts(path, hashed)) == plain
    assert hashed.digest == filedigest.file_digest(path) is not None


def test_no_digest_for_a_file_changed_during_the_walk(tmp_path):
    path = tmp_path / "s.tar"
    _shard(path, [2000, 3000, 4000])
    hashed = filedigest.HashedReads()
    for i, _ in enumerate(audit._pack_parts(path, hashed)):
        if i == 0:
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime put back: only the ctime tells
    assert hashed.digest is None


def test_audit_records_the_digest_of_the_bytes_it_checked(tmp_path):
    path = tmp_path / "s.tar"
    _shard(path, [100, 200])
    hashed = filedigest.HashedReads()
    parts = list(audit._pack_parts(path, hashed))
    assert parts and hashed.digest == filedigest.file_digest(path)
    with open(path, "r+b") as f:  # one byte changed after the walk: the file's digest moves, the walk's does not
        f.seek(600)
        f.write(bytes([f.read(1)[0] ^ 1]))
    assert filedigest.file_digest(path) != hashed.digest


def test_a_skipped_payload_is_hashed_a_chunk_at_a_time_not_read_whole(tmp_path, monkeypatch):
    """A gap the walk never reads (a payload it skips) larger than a chunk: hashed chunk by chunk, so a corrupt
    header's huge size costs no memory; the digest is still the whole file's."""
    monkeypatch.setattr(filedigest, "CHUNK", 4096)
    path = tmp_path / "s.tar"
    path.write_bytes(bytes(k % 251 for k in range(100_000)))
    reads = []
    real = os.pread
    monkeypatch.setattr(filedigest.os, "pread", lambda fd, n, at: reads.append(n) or real(fd, n, at))
    hashed = filedigest.HashedReads()
    with open(path, "rb") as f:
        hashed.begin(f.fileno())
        assert hashed.pread(f.fileno(), 100, 0) == real(f.fileno(), 100, 0)
        assert hashed.pread(f.fileno(), 512, 90_000) == real(f.fileno(), 512, 90_000)  # 90 KB skipped
        hashed.finish()
    assert max(reads, default=0) <= 4096 + 512
    assert hashed.digest == filedigest.file_digest(path)
