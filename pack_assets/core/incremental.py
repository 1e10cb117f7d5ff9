"""The append-only incremental plan: when no sample of the stored plan changed, the rerun only appends.

An incremental plan keeps every stored pack and plans the samples it does not hold after them. When none of
the stored packs or drops changed (no sample gone, none recounted, none split, no member's media type changed:
looked up only in the shards whose manifest or token_lengths file is not the one the stored plan's check read,
`manifest_stamps`, when few changed),
nothing of the stored plan needs to come into Python: `appendable` reads its figures (samples per pack, totals,
the last pack and output shard), `every_length` reads every ok sample's length and media type (for the what-if
sweep and the lower bound: no sample id) and `appended_rows` the rows of the samples to plan, found by an anti-join
in DuckDB in the shards whose stamps changed since the stored plan's check (`changed_shards`); nothing else of the
catalog is read into Python (issue 41 item 4). The tables then take the new rows (`store.save_plan(append=True)`),
pack_plan.jsonl its new lines (`append_plan_file`), and the check looks at the new packs (`plancheck.check_plan`'s
``since``). What comes out is byte-identical to the incremental plan that reads the whole stored plan
(`plan._previous_plan`), which runs whenever this one does not apply.

pack_plan.jsonl is appended only where it is the very file the stored plan's run wrote and checked: its size
and xxh3 digest are recorded in plan_info (``plan_file``) once the plan's check passed. A run killed between
the file's rename and the tables' commit (or before the record) leaves a file that does not match: the next run
rewrites it whole.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from . import filedigest, safety, store
from .packs import IDS, arrow_ints

PLAN_FILE = "plan_file"  # plan_info's record of pack_plan.jsonl as the plan's run wrote it: bytes and xxh3
# plan_info's record, beside it, of each planned shard's manifest samples file as the plan found it (`manifest_stamps`)
MANIFEST_STAMPS = "manifest_stamps"
_READ = 8 << 20

_UNPLANNED = ("sample_id NOT IN (SELECT sample_id FROM pack_members) "
              "AND sample_id NOT IN (SELECT sample_id FROM dropped)")
# a stored member or drop whose ok length in token_lengths is not the stored one now (gone, not ok, recounted);
# {media}: a member whose media type (the catalog's, which the plan check reads) is not its pack's now.
# {members}, {dropped}: the stored rows looked at; {within}: the token_lengths rows they are looked up in
_OK_LENGTHS = "(SELECT sample_id, shard, total_tokens FROM token_lengths WHERE status = 'ok'{within})"
_CHANGED = f"""SELECT
    EXISTS (SELECT 1 FROM {{members}} pm JOIN pack_plan p USING (pack_id)
            LEFT JOIN {_OK_LENGTHS} t USING (sample_id){{join}}
            WHERE t.total_tokens IS DISTINCT FROM p.sample_token_lens[pm.position + 1]{{media}})
    OR EXISTS (SELECT 1 FROM {{dropped}} d LEFT JOIN {_OK_LENGTHS} t USING (sample_id)
               WHERE t.total_tokens IS DISTINCT FROM d.total_tokens)
    OR EXISTS (SELECT 1 FROM split_pieces)"""
_EVERY = {"members": "pack_members", "dropped": "dropped", "within": ""}
# only the members and drops of the given shards ($1: a sample id is <shard>/<key>, so with those of the shards
# nested under them), looked up in the rows of the shards that may hold them ($2: `related`)
_PREFIXED = ("(SELECT x.* FROM {} x JOIN (SELECT unnest({}::VARCHAR[]) || '/' AS prefix) "
             "ON starts_with(x.sample_id, prefix))")
_ONLY = {"members": _PREFIXED.format("pack_members", "$1"), "dropped": _PREFIXED.format("dropped", "$1"),
         "within": " AND list_contains($2::VARCHAR[], shard)"}
FEW = 16  # at most this many changed shards: the stored rows of those alone are looked at (else every one)
_RETYPED = {"media": " OR s.media_type IS DISTINCT FROM p.media_type",
            "join": "\n            LEFT JOIN (SELECT sample_id, media_type FROM manifest_samples) s USING (sample_id)"}
# the media types of the members of the given shards only (those whose manifest changed since the stored plan)
_RETYPED_IN = {"media": " OR (list_contains($1::VARCHAR[], t.shard) AND s.media_type IS DISTINCT FROM p.media_type)",
               "join": "\n            LEFT JOIN (SELECT sample_id, media_type FROM manifest_samples "
                       "WHERE list_contains($1::VARCHAR[], shard)) s USING (sample_id)"}
_LENGTHS_ONLY = {"join": "", "media": ""}


@dataclass(frozen=True)
class Base:
    """The stored plan an append extends, as figures: no sample id of it in Python."""

    sizes: np.ndarray  # samples per pack, pack id order (the training order)
    packed_tokens: int
    next_number: int  # the first new pack's number
    next_shard: int  # the first new output shard's number
    output_shards: int
    dropped_ids: list[str]
    fingerprint: str
    plan_file: dict  # the stored pack_plan.jsonl's bytes and xxh3
    # the shards whose manifest or token_lengths file is not the one the stored plan's check read (None: unknown)
    changed: list[str] | None = None


def appendable(con, info: dict, path: Path, per_media_type: bool = True, stamps: dict | None = None
               ) -> Base | None:
    """The stored plan's figures when the rerun may append to it (its plan file recorded and unchanged, none of
    its samples changed since), else None. The caller has checked its settings and profile.

    What the whole plan's check (`plancheck.check_plan`) reads of a stored pack and an append checks only for
    the new packs must be unchanged: a member's ok length (so its place, padding and the pack's totals) and,
    with ``per_media_type`` (packs of one media type, `PlanConfig.pack_per_media_type`), its media type. (Without
    it the media types enter only the groups' check, which an append runs over every pack.) A media type is
    looked up only for the members of shards whose ``stamps`` (`manifest_stamps`, taken before this plan read
    the catalog) differ from those the stored plan recorded: a manifest file of the same stamp is the one the
    stored plan's check read, which found every member's media type its pack's."""
    record = info.get(PLAN_FILE)
    if not record or _file_digest(path, record["bytes"]) != record["xxh3"]:
        return None
    if con.execute(*_changed_query(info, per_media_type, stamps)).fetchall()[0][0]:
        return None
    col = con.sql("SELECT len(sample_ids)::BIGINT AS n FROM pack_plan ORDER BY pack_id").to_arrow_table().column(0)
    sizes = arrow_ints(col.combine_chunks()) if len(col) else np.zeros(0, np.int64)  # (no buffer when empty)
    tokens, number, shard, shards = con.execute(
        "SELECT coalesce(sum(total_token_len), 0), max(CAST(substr(pack_id, 2) AS BIGINT)), "
        "max(CAST(regexp_extract(output_shard, '(\\d+)', 1) AS BIGINT)), count(DISTINCT output_shard) "
        "FROM pack_plan").fetchall()[0]
    dropped = [r[0] for r in con.execute("SELECT sample_id FROM dropped").fetchall()]
    return Base(sizes, int(tokens), 0 if number is None else number + 1, 0 if shard is None else shard + 1,
                int(shards), dropped, info["fingerprint"], record, changed_shards(info, stamps))


def changed_shards(info: dict, stamps: dict | None) -> list[str] | None:
    """The shards whose ``stamps`` (`manifest_stamps`) are not those the stored plan recorded (their rows are not
    those the stored plan's check read: new, changed, or gone from the catalog), in order; None when either is
    unknown or more than `FEW` changed (then every shard is looked at)."""
    recorded = info.get(MANIFEST_STAMPS)
    if stamps is None or recorded is None:
        return None
    changed = sorted({s for s, stamp in stamps.items() if recorded.get(s) != stamp} | (recorded.keys() - stamps.keys()))
    return changed if len(changed) <= FEW else None


def related(changed: list[str], shards: Iterable[str]) -> list[str]:
    """Of ``shards``, the ``changed`` ones and those whose sample ids may share a prefix with theirs (a sample id is
    <shard>/<key>, a key may hold '/'): the shards in folders they name, and those named like folders they are in.
    A row of a sample id of the changed shards can be in these shards' files alone."""
    given = set(changed)
    above = {c[:i] for c in changed for i, ch in enumerate(c) if ch == "/"}
    return [s for s in shards if s in given or s in above or any(s[:i] in given for i, ch in enumerate(s) if ch == "/")]


def _changed_query(info: dict, per_media_type: bool, stamps: dict | None) -> tuple[str, list]:
    """`_CHANGED` for `appendable`. When the stamps of both plans are known and `FEW` shards changed, only the
    stored members and drops of those: a shard of the recorded stamps has the manifest and token_lengths files
    the stored plan's check read, whose lengths (and media types) were its members'. Else every stored row; its
    media types (with ``per_media_type``) then those of the changed shards' members (every member's, unknown)."""
    media = _RETYPED_IN if per_media_type else _LENGTHS_ONLY
    changed = changed_shards(info, stamps)
    if changed is not None:
        return _CHANGED.format(**_ONLY, **media), [changed, related(changed, stamps)]
    recorded = info.get(MANIFEST_STAMPS)
    if not per_media_type or stamps is None or recorded is None:
        return _CHANGED.format(**_EVERY, **(_RETYPED if per_media_type else _LENGTHS_ONLY)), []
    every = sorted(s for s, stamp in stamps.items() if recorded.get(s) != stamp)
    return _CHANGED.format(**_EVERY, **_RETYPED_IN), [every]


def manifest_stamps(con) -> dict[str, list | None]:
    """Each shard of the catalog: the stamps (size, mtime, inode and ctime; None when gone) of its manifest samples
    file and of its token_lengths file, what `appendable` and the appended plan's check compare with the stored
    plan's record. Taken before the plan reads the catalog, so a file changed after its stamp was taken differs
    from it the next time. (A record of manifest stamps alone, an older plan's, differs from every shard's.)"""
    rows = con.execute("SELECT shard, manifest_dir, token_dir FROM catalog_shards").fetchall()
    return {shard: [_stamp(Path(m) / "samples.parquet"), _stamp(Path(t) / "token_lengths.parquet")]
            for shard, m, t in rows}


def _stamp(path: Path) -> list | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]  # (a copy with its mtime kept still differs)


# every ok sample's length and media type in sample id order (`plan.ok_lengths`' order), and whether the stored plan
# drops it; no sample id
_LENGTHS = """SELECT total_tokens AS lengths, list_position(?::VARCHAR[], media_type) - 1 AS media_types,
    CAST(sample_id IN (SELECT sample_id FROM dropped) AS TINYINT) AS stored_drop
  FROM token_lengths WHERE status = 'ok' ORDER BY sample_id"""
_INTS = ("lengths", "media_types", "stored_drop")
_NULL_COUNT = "total_tokens IS NULL OR media_bytes IS NULL OR n_images + n_videos IS NULL OR vision_tokens IS NULL"
# `plan.ok_lengths`' rows of the ok samples the stored plan neither packs nor drops ({only}: of the given shards)
_NEW_ROWS = """SELECT sample_id AS sample_ids, list_position($1::VARCHAR[], media_type) - 1 AS media_types,
    total_tokens AS lengths, media_bytes, n_images + n_videos AS n_media, vision_tokens
  FROM token_lengths WHERE status = 'ok'{only} AND sample_id NOT IN (SELECT sample_id FROM {members})
    AND sample_id NOT IN (SELECT sample_id FROM {dropped}) ORDER BY sample_id"""
# a sample of the given shards ($2) is packed or dropped under its own id, <shard>/<key>: only the stored rows of
# those ids are looked at
_NEW_IN = {"only": " AND list_contains($2::VARCHAR[], shard)", "members": _PREFIXED.format("pack_members", "$2"),
           "dropped": _PREFIXED.format("dropped", "$2")}
_NEW_ANY = {"only": "", "members": "pack_members", "dropped": "dropped"}


@dataclass(frozen=True)
class Lengths:
    """Every ok sample's length and media type in sample id order (`plan.ok_lengths`' order: what the what-if
    sweep and an append's lower bound take), and which of them the stored plan drops. No sample id."""

    lengths: np.ndarray
    codes: np.ndarray  # the media type, an index into ``types``
    types: np.ndarray  # (objects: str)
    stored_drop: np.ndarray  # bool

    def sweep_rows(self) -> dict[str, np.ndarray]:
        """`plan.ok_lengths`' lengths and media types (what `plan.run_plan`'s ``on_lengths`` takes)."""
        return {"lengths": self.lengths, "media_types": self.types[self.codes]}


def every_length(con, batch: int, memory: str) -> Lengths:
    """`Lengths`, fetched ``batch`` rows at a time, the sort held to ``memory``; a NULL count refused, as
    `plan.ok_lengths` refuses it."""
    ok = "FROM token_lengths WHERE status = 'ok'"
    types = [r[0] for r in con.execute(f"SELECT DISTINCT media_type {ok} ORDER BY 1").fetchall() if r[0] is not None]
    n, nulls = con.execute(f"SELECT count(*), count(*) FILTER (WHERE {_NULL_COUNT}) {ok}").fetchall()[0]
    if nulls:  # (a NULL is never taken for 0)
        raise ValueError("token_lengths has an ok row with a NULL count: count its shard again (--force)")
    cols = {k: np.zeros(n, np.int64) for k in _INTS}
    at = 0
    with store.held_to(con, memory):
        for b in con.sql(_LENGTHS, params=[types]).to_arrow_reader(batch):
            if any(b.column(k).null_count for k in _INTS):  # (a NULL media type)
                raise ValueError("token_lengths has an ok row with a NULL count: count its shard again (--force)")
            for k in _INTS:
                got = arrow_ints(b.column(k))
                if at == 0:
                    cols[k] = np.empty(n, got.dtype)  # (`plan.ok_lengths`' dtypes)
                cols[k][at:at + len(got)] = got
            at += b.num_rows
    if at != n:
        raise RuntimeError("token_lengths changed while the plan read it: run again")
    return Lengths(cols["lengths"], cols["media_types"], np.asarray(types, dtype=object),
                   cols["stored_drop"].astype(bool))


@dataclass(frozen=True)
class Appending:
    """What an append reads of the catalog: `Lengths`, and the rows of the ok samples the stored plan neither
    packs nor drops (`plan.ok_lengths`' form: `plan.make_plan`'s inputs). No other sample id comes into Python."""

    every: Lengths
    new: dict[str, np.ndarray]  # the new samples' rows
    changed: list[str] | None  # the shards the new samples were looked for in (None: every shard)

    def of_new(self, sample_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The lengths and media type codes (into ``every.types``) of the given new samples."""
        place = {sid: k for k, sid in enumerate(self.new["sample_ids"].tolist())}
        at = np.asarray([place[sid] for sid in sample_ids], np.int64)
        code = {mt: k for k, mt in enumerate(self.every.types.tolist())}
        return self.new["lengths"][at], np.asarray([code[mt] for mt in self.new["media_types"][at].tolist()], np.int64)


def appended_rows(con, base: Base, every: Lengths) -> Appending:
    """`Appending` for the stored plan ``base`` (`appendable`'s) and ``every`` length. The new samples are looked
    for in ``base.changed`` (an ok sample of another shard is one the stored plan's check found packed or dropped,
    and its rows stay); counted against every ok sample (each stored member or drop is one, `appendable` found,
    and once), and looked for everywhere when the counts differ (if they still do, token_lengths changed meanwhile:
    refused, as `plan.ok_lengths` against the anti-join refused it)."""
    types = every.types.tolist()
    changed, stored = base.changed, int(base.sizes.sum()) + len(base.dropped_ids)
    new = _new_rows(con, types, changed)
    if changed is not None and stored + len(new["sample_ids"]) != len(every.lengths):
        changed, new = None, _new_rows(con, types, None)
    if stored + len(new["sample_ids"]) != len(every.lengths):  # (each stored row is an ok sample: `appendable`)
        raise RuntimeError("token_lengths changed while the plan read it: run again")
    return Appending(every, new, changed)


def _new_rows(con, types: list[str], changed: list[str] | None) -> dict[str, np.ndarray]:
    """`plan.ok_lengths`' rows of the ok samples the stored plan neither packs nor drops, of the ``changed``
    shards (every shard's when None)."""
    sql = _NEW_ROWS.format(**(_NEW_ANY if changed is None else _NEW_IN))
    table = con.sql(sql, params=[types] if changed is None else [types, changed]).to_arrow_table()
    if any(table.column(k).null_count for k in table.column_names):
        raise ValueError("token_lengths has an ok row with a NULL count: count its shard again (--force)")
    rows = {k: arrow_ints(table.column(k).combine_chunks()) if table.num_rows else np.zeros(0, np.int64)
            for k in table.column_names if k != "sample_ids"}
    rows["media_types"] = np.asarray(types, dtype=object)[rows["media_types"]] if types else np.asarray([], object)
    rows["sample_ids"] = np.asarray(table.column("sample_ids").to_pylist(), dtype=IDS)
    return {k: rows[k] for k in ("sample_ids", "media_types", "lengths", "media_bytes", "n_media", "vision_tokens")}


def _file_digest(path: Path, size: int) -> str | None:
    """xxh3 of the file when it holds exactly ``size`` bytes, else None."""
    try:
        return filedigest.file_digest(path) if path.stat().st_size == size else None
    except FileNotFoundError:
        return None


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            yield chunk


class _Counted:
    """Parts passed through, their bytes counted and hashed (what `plan_record` records)."""

    def __init__(self, parts: Iterable[bytes]):
        self.parts, self.size, self.hash = parts, 0, xxhash.xxh3_128()

    def __iter__(self) -> Iterator[bytes]:
        for part in self.parts:
            self.size += len(part)
            self.hash.update(part)
            yield part

    def record(self) -> dict:
        return {"bytes": self.size, "xxh3": self.hash.hexdigest()}


def _encoded(parts: Iterable[str]) -> Iterator[bytes]:
    return (p.encode("utf-8") for p in parts)


def write_plan_file(path: Path, parts: Iterable[str]) -> dict:
    """pack_plan.jsonl written whole (atomically); its record."""
    counted = _Counted(_encoded(parts))
    safety.atomic_write_bytes(path, counted)
    return counted.record()


def append_plan_file(path: Path, base: Base, tail: Iterable[str]) -> dict:
    """pack_plan.jsonl with ``tail`` appended, atomically: the stored file copied (and checked against its record
    again as it is read) into a temporary sibling, the tail written after it, then renamed over it; its record."""
    def stored() -> Iterator[bytes]:
        h = xxhash.xxh3_128()
        for chunk in _chunks(path):
            h.update(chunk)
            yield chunk
        if h.hexdigest() != base.plan_file["xxh3"]:
            raise RuntimeError(f"{path} changed while the plan appended to it: run again")

    counted = _Counted(itertools.chain(stored(), _encoded(tail)))
    safety.atomic_write_bytes(path, counted)
    return counted.record()


def record_plan_file(con, record: dict, stamps: dict | None = None) -> None:
    """plan_info's record of pack_plan.jsonl, once the plan in the tables passed its check; with the ``stamps``
    of the manifests it was planned from (`manifest_stamps`)."""
    info = store.read_plan_info(con)
    stamped = {MANIFEST_STAMPS: stamps} if stamps is not None else {}
    con.execute("UPDATE plan_info SET info = ?", [json.dumps({**info, PLAN_FILE: record, **stamped})])

