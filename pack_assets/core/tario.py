"""The WebDataset tar format, read and written: used by scan, write, audit, the reader, demo and convert.

Reading walks 512-byte headers with ``pread`` and never extracts: a member is its name, payload offset and
size. Writing uses fixed header fields (mtime 0, uid/gid 0, mode 0644, PAX format when ustar cannot hold a
name), so the same members give the same bytes. Member names follow the WebDataset rule: the key is the
path up to the first dot of the basename, the rest is the part.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from zlib import adler32

import numpy as np

from .reasons import ReasonError

BLOCK = 512
RECORD = BLOCK * 20
_TYPES = {b"0": "file", b"\0": "file", b"7": "file", b"5": "dir", b"1": "link", b"2": "link",
          b"3": "special", b"4": "special", b"6": "special"}
_EXTENDED = (b"x", b"g", b"L", b"K")
_COMPRESSION_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}


@dataclass(slots=True, unsafe_hash=True)
class Entry:
    """One tar member header: name, payload offset and size, and its type. (Not frozen, hashed as if it were:
    a reader makes one per member, and a frozen dataclass's __init__ sets each field through
    object.__setattr__; nothing changes an Entry once made.)"""

    name: str
    offset: int
    size: int
    kind: str  # file | dir | link | special | break
    detail: str = ""
    header: int = -1  # where this member's header blocks begin (extended headers included)
    reason: str = "truncated_tar"  # for a break: the code its sample (or the shard) is rejected with


def split_key(name: str) -> tuple[str, str]:
    """WebDataset rule: the key is the path up to the first dot of the basename; the rest is the part."""
    dot = name.find(".", name.rfind("/") + 1)  # string ops, not posixpath: this runs for every member
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def is_meta_member(name: str) -> bool:
    base = name[name.rfind("/") + 1 :]
    return base.startswith("__") and base.split(".", 1)[0].endswith("__")


def is_unsafe_name(name: str) -> bool:
    return name.startswith("/") or ".." in name.split("/") or name.startswith("\\")


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of ``size`` bytes at ``offset`` of an open file (a member's payload)."""

    def __init__(self, f, offset: int, size: int):
        self._f, self._start, self._size, self._pos = f, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _number(field: bytes) -> int:
    """A tar numeric field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] & 0x80:
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else n
    field = field.split(b"\0", 1)[0].strip()
    return int(field, 8) if field else 0


def _size_field(buf: bytes) -> int:
    """``_number`` of a header's size field; the usual one (eleven octal digits then NUL) read directly. ``int``
    strips the same whitespace as ``bytes.strip`` and refuses a NUL or a byte >= 0x80: those go to ``_number``."""
    if buf[135] == 0:
        try:
            return int(buf[124:135], 8)
        except ValueError:
            pass
    return _number(buf[124:136])


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _signed_checksum(buf: bytes) -> int:
    """Some old tar writers summed the header as signed chars; tarfile accepts both."""
    return sum(struct.unpack("148b8x356b", buf)) + 256


def header_sum(buf: bytes) -> int:
    """``sum(buf)`` of a 512-byte header, in C: Adler-32's low half is 1 + the byte sum modulo 65521, which is
    the sum itself for 256 bytes (at most 65,280). Python's ``sum`` walks the bytes one object at a time."""
    return (zlib.adler32(buf[:256]) & 0xFFFF) + (zlib.adler32(buf[256:]) & 0xFFFF) - 2


def _checksum_matches(buf: bytes, stored: int) -> bool:
    # the signed sum only when the usual one fails: it costs more than the rest of a header's parsing. The
    # unsigned one is the bytes outside the checksum field (three Adler-32 low halves: each run's byte sum stays
    # below 65521) plus the field as 8 spaces (256)
    unsigned = (adler32(buf[:148]) & 0xFFFF) + (adler32(buf[156:256]) & 0xFFFF) + (adler32(buf[256:]) & 0xFFFF) + 253
    return stored == unsigned or stored == _signed_checksum(buf)


def _header_name(buf: bytes) -> str:
    name = _text(buf[0:100])
    if buf[257:262] == b"ustar" and buf[345] != 0:
        name = _text(buf[345:500]) + "/" + name
    return name


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _pax(data: bytes) -> dict[str, str]:
    """PAX records ``"LEN key=value\n"``; a malformed record raises ValueError (a length that does not fit
    could otherwise loop forever or read past the header)."""
    out, pos = {}, 0
    while pos < len(data):
        if data[pos] == 0 and not data[pos:].strip(b"\0"):
            break  # NUL padding after the last record
        sp = data.find(b" ", pos)
        if sp < 0 or not data[pos:sp].isdigit():
            raise ValueError(f"PAX record at byte {pos}: no decimal length field")
        end = pos + int(data[pos:sp])
        if end <= sp + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise ValueError(f"PAX record at byte {pos}: length {int(data[pos:sp])} does not match the record")
        key, eq, value = data[sp + 1 : end - 1].partition(b"=")
        if not eq or not key:
            raise ValueError(f"PAX record at byte {pos}: no key=value")
        out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


def _next_name(fd, pos: int) -> str:
    """The name in the plain header at ``pos`` when it is one (what a broken extended header described), so
    the break is charged to that member's sample rather than to the complete sample before it."""
    buf = os.pread(fd, BLOCK, pos)
    if len(buf) < BLOCK or buf[156:157] in _EXTENDED:
        return ""
    try:
        if not _checksum_matches(buf, _number(buf[148:156])):
            return ""
    except ValueError:
        return ""
    return _header_name(buf)


def _refuse_non_tar(f) -> None:
    """An empty or compressed file is a shard-level rejection, not a break."""
    head = f.read(8)
    f.seek(0)
    if not head:
        raise ReasonError("empty_shard", "zero-byte file")
    for magic, kind in _COMPRESSION_MAGIC.items():
        if head.startswith(magic):
            raise ReasonError("compressed_tar", f"starts with {kind} magic bytes")


def _stored_checksum(buf: bytes) -> int:
    try:
        if buf[154] == 0:  # the usual field, six octal digits then NUL (and a space): what _number gives, or a
            return int(buf[148:154], 8)  # ValueError for anything else (a NUL, base-256, no digits), then _number
    except ValueError:
        pass
    try:
        return _number(buf[148:156])
    except ValueError:
        return -1


def _archive_end(buf: bytes, pos: int, trailer: list[int] | None) -> Entry | None:
    """Where no member header follows: the end-of-archive blocks (None) or a break; at offset 0 the file
    is no tar at all."""
    if len(buf) < BLOCK:
        if pos == 0:
            raise ReasonError("not_a_tar", f"{len(buf)} bytes: shorter than one tar header")
        return Entry("", pos, 0, "break", f"no end-of-archive blocks after offset {pos}")
    if buf.count(0) == BLOCK:
        if pos == 0:
            raise ReasonError("empty_shard", "the archive holds only end-of-archive blocks")
        if trailer is not None:
            trailer.append(pos)
        return None
    if pos == 0:
        raise ReasonError("not_a_tar", "no valid tar header at offset 0")
    return Entry("", pos, 0, "break", f"invalid tar header at offset {pos}")


def _read_extended(fd, typeflag: bytes, data_at: int, size: int, file_size: int,
                   next_pos: int, pread) -> tuple[Entry | None, dict | None, str | None]:
    """An extended header's payload: (a break, or None), and the PAX records or the GNU long name it
    gives for the next member (None when it gives none)."""
    data = pread(fd, size, data_at) if data_at + size <= file_size else b""
    if len(data) < size:
        cut = Entry("", data_at, size, "break", f"extended header at offset {data_at - BLOCK} is cut short")
        return cut, None, None
    if typeflag == b"x":
        try:
            return None, _pax(data), None
        except ValueError as e:
            return Entry(_next_name(fd, next_pos), data_at, size, "break",
                         f"malformed PAX header at offset {data_at - BLOCK}: {e}", reason="bad_tar_header"), None, None
    if typeflag == b"L":
        return None, None, data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return None, None, None


def _member(name: str, typeflag: bytes, data_at: int, size: int, file_size: int, header: int) -> Entry:
    kind = _TYPES.get(typeflag, "special")
    if kind == "dir" or name.endswith("/"):
        kind, name = "dir", name.rstrip("/")
    if kind == "file" and data_at + size > file_size:
        detail = f"member {name!r} claims {size} bytes at offset {data_at}; the file has {file_size}"
        return Entry(name, data_at, size, "break", detail)
    return Entry(name, data_at, size, kind, header=header)


def iter_entries(f, file_size: int, trailer: list[int] | None = None, pread=None) -> Iterator[Entry]:
    """Yield tar headers in order, reading 512-byte headers with ``pread`` and seeking past payloads.

    Handles ustar (with prefix), GNU long names and PAX path/size records, the formats ``tarfile`` and
    webdataset write; the test suite checks it against ``tarfile`` on every fixture archive. Where the
    archive breaks, one ``kind="break"`` entry (named after the member it broke in, if known) ends the
    stream; a file that is not a tar at all raises ReasonError. ``trailer`` receives the offset of the
    end-of-archive blocks. ``pread``: reads as ``os.pread`` does (the audit's also hash what they read); by
    default ``os.pread`` as it is at the call.
    """
    _refuse_non_tar(f)
    fd = f.fileno()
    pread = pread or os.pread
    pos, long_name, pax, start = 0, None, {}, None
    while True:
        if start is None:
            start = pos
        buf = pread(fd, BLOCK, pos)
        # (no count of zero bytes here: an all-zero block fails the checksum, stored 0 against 256, and
        # `_archive_end` tells the end-of-archive blocks from a break)
        if len(buf) < BLOCK or not _checksum_matches(buf, _stored_checksum(buf)):
            end = _archive_end(buf, pos, trailer)
            if end is not None:
                yield end
            return
        typeflag, data_at = buf[156:157], pos + BLOCK
        extended = typeflag in _EXTENDED
        try:
            size = _size_field(buf)
            if size < 0:
                raise ValueError(f"negative size {size}")
        except ValueError as e:
            name = "" if extended else (long_name or pax.get("path") or _text(buf[0:100]))
            yield Entry(name, data_at, 0, "break", f"bad size field in the tar header at offset {pos}: {e}",
                        reason="bad_tar_header")
            return
        pos = data_at + _padded(size)
        if extended:  # extended headers describe the next member
            broken, new_pax, new_name = _read_extended(fd, typeflag, data_at, size, file_size, pos, pread)
            if broken is not None:
                yield broken
                return
            pax = pax if new_pax is None else new_pax
            long_name = long_name if new_name is None else new_name
            continue
        name = pax.get("path", _header_name(buf) if long_name is None else long_name)
        if "size" in pax:
            if not (pax["size"].isascii() and pax["size"].isdigit()):
                yield Entry(name, data_at, 0, "break", f"PAX size {pax['size'][:40]!r} of member {name!r} is not a "
                            f"number", reason="bad_tar_header")
                return
            size = int(pax["size"])
            pos = data_at + _padded(size)
        entry = _member(name, typeflag, data_at, size, file_size, start)
        long_name, pax, start = None, {}, None
        yield entry
        if entry.kind == "break":
            return


def group_by_key(entries: Iterable[Entry]) -> Iterator[tuple[str, list[Entry]]]:
    """Runs of consecutive members with one key (directories and __meta__ members are not samples).

    A break joins the run it happened in: a nameless break (a bad header, a missing end-of-archive
    block) joins the run in progress, since that run may have lost members.
    """
    key, run = None, []
    for e in entries:
        if e.kind == "dir" or (e.kind != "break" and is_meta_member(e.name)):
            continue
        k = split_key(e.name)[0] if e.name else key
        if k != key and run:
            yield key, run
            run = []
        key = k
        run.append(e)
    if run:
        yield key, run


def iter_pack_parts(path: str | Path):
    """(pack key, {part name: bytes}) for each pack of an output shard, grouped by the WebDataset key."""
    with tarfile.open(path, "r:") as tf:
        key, parts = None, {}
        for ti in tf:
            k, part = split_key(ti.name)
            if k != key and parts:
                yield key, parts
                parts = {}
            key = k
            parts[part] = tf.extractfile(ti).read() if ti.isfile() else None
            tf.members.clear()
        if parts:
            yield key, parts


def first_pack_meta(path: Path) -> dict | None:
    """``_meta`` of the first pack of an output shard (None when unreadable)."""
    try:
        with tarfile.open(path, "r:") as tf:
            ti = tf.next()
            if ti is None or not ti.name.endswith(".json"):
                return None
            return json.loads(tf.extractfile(ti).read())["_meta"]
    except (OSError, tarfile.TarError, ValueError, KeyError):
        return None


def media_name(pack_id: str, sub: int, item: int, source_name: str) -> str:
    """WebDataset rule: the key (pack id) ends at the first dot; the sub-sample index follows it."""
    ext = source_name.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower()
    return f"{pack_id}.s{sub:03d}_{item:02d}.{ext}"


def extra_name(pack_id: str, sub: int, item: int, source_name: str) -> str:
    """An extra member (not the record, not its media): ``{pack}.sIII_xJJ.EXT``, the source's last extension."""
    base = source_name.rsplit("/", 1)[-1]
    ext = base.rsplit(".", 1)[-1].lower() if "." in base else ""
    return f"{pack_id}.s{sub:03d}_x{item:02d}" + (f".{ext}" if ext else "")


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
    return ti


def _tarfile_header(name: str, size: int) -> bytes:
    return _tarinfo(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _ustar_template() -> bytes:
    buf = bytearray(BLOCK)
    buf[100:108] = b"0000644\0"
    buf[108:116] = b"0000000\0"
    buf[116:124] = b"0000000\0"
    buf[136:148] = b"00000000000\0"
    buf[148:156] = b" " * 8  # the checksum is summed with its own field as spaces
    buf[156] = ord("0")
    buf[257:265] = b"ustar\x0000"
    return bytes(buf)


_USTAR_TEMPLATE = _ustar_template()


_TEMPLATE_SUM = sum(_USTAR_TEMPLATE)  # name and size fields are zero in the template: they add their own bytes
_T_MODE_TO_SIZE, _T_MTIME_TO_CHK = _USTAR_TEMPLATE[100:124], _USTAR_TEMPLATE[136:148]
_T_AFTER_CHK = _USTAR_TEMPLATE[156:]


def member_header(name: str, size: int) -> bytes:
    """The tar header of a regular member with fixed fields (what tarfile writes, built directly for the
    common short ASCII name; tests check the bytes against tarfile). The checksum is the template's plus the
    name's and the size field's bytes, so the 512 bytes are not summed per member."""
    if len(name) < 100 and name.isascii() and size < 8**11:
        raw = name.encode("ascii")
        size_field = b"%011o\0" % size
        chk = b"%06o\0 " % (_TEMPLATE_SUM + sum(raw) + sum(size_field))
        return b"".join((raw, bytes(100 - len(raw)), _T_MODE_TO_SIZE, size_field, _T_MTIME_TO_CHK, chk, _T_AFTER_CHK))
    return _tarfile_header(name, size)


_OCTAL_SIZE = 3 * np.arange(10, -1, -1, dtype=np.int64)  # the size field's 11 digits, most significant first
_OCTAL_SUM = 3 * np.arange(5, -1, -1, dtype=np.int64)  # the checksum's 6


def header_rows(names: list[str], sizes) -> np.ndarray | None:
    """``member_header`` of each (name, size) as the rows of one array, built together (numpy: the names' bytes
    scattered into the template's rows, the size fields' digits, each row's checksum from the bytes that differ
    from the template); None unless every name is short ASCII and every size fits ustar (`member_header`'s
    fast case)."""
    n = len(names)
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=n)
    sizes = np.asarray(sizes, dtype=np.int64)
    if not n or lengths.max() >= 100 or not all(map(str.isascii, names)) or sizes.max() >= 8**11:
        return None
    rows = np.tile(np.frombuffer(_USTAR_TEMPLATE, dtype=np.uint8), (n, 1))
    # the names by length (a shard's are mostly of one or two), each length's block of names in one assignment
    order = np.argsort(lengths, kind="stable")
    chars = np.frombuffer("".join([names[i] for i in order.tolist()]).encode("ascii"), dtype=np.uint8)
    by_length = lengths[order]
    cuts = [0, *(np.flatnonzero(np.diff(by_length)) + 1).tolist(), n]
    at = 0
    # the checksum: the template's, each name's bytes (the rest of its field is the template's zeros) and its size
    # field's digits, summed from the names and digits, not from the 512-byte rows
    total = np.empty(n, dtype=np.int64)
    for a, b in zip(cuts, cuts[1:]):
        width = int(by_length[a])
        block = chars[at:at + (b - a) * width].reshape(b - a, width)
        rows[order[a:b], :width] = block
        total[order[a:b]] = block.sum(axis=1, dtype=np.int64)
        at += (b - a) * width
    digits = sizes[:, None] >> _OCTAL_SIZE & 7
    rows[:, 124:135] = digits + 48
    total += _TEMPLATE_SUM + 48 * len(_OCTAL_SIZE) + digits.sum(axis=1)
    rows[:, 148:154] = (total[:, None] >> _OCTAL_SUM & 7) + 48
    rows[:, 154:156] = (0, 32)
    return rows


def padding(n: int) -> bytes:
    """The zero bytes that fill a payload of ``n`` bytes up to the next block."""
    return b"\0" * (-n % BLOCK)


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    """One regular member through ``tarfile``, with the same fixed fields as ``member_header``."""
    tf.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


IOV_MAX = 1024  # buffers per os.writev call (Linux IOV_MAX)


def writev_all(fd: int, bufs: list) -> None:
    """os.writev until every buffer is written (a short write resumes inside the buffer it stopped in)."""
    i = 0
    while i < len(bufs):
        batch = bufs[i:i + IOV_MAX]
        n = os.writev(fd, batch)
        if n == sum(map(len, batch)):  # the whole batch (the usual case): no walk over its buffers
            i += len(batch)
            continue
        for b in batch:
            if n >= len(b):
                n -= len(b)
                i += 1
            else:
                bufs[i] = memoryview(b)[n:]
                break
