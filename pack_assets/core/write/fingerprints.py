"""Which output shards already hold exactly their planned content: a shard's content fingerprint (its first
pack's ``_meta`` carries it), computed the same way from a writer's job and from one catalog query over
every planned shard, so a rerun finds the current shards without loading their jobs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..tario import first_pack_meta
from .jobs import ShardJob, ShardResult, dumps, encode_str, piece_shards


def member_key(m: dict | None) -> str:
    """A source member as the fingerprint sees it: name (the output name's extension), place and content
    (sha256; None when not hashed, then the place stands in for it)."""
    if m is None:
        return "-"
    # == json.dumps([name, offset, size, sha256], ensure_ascii=False), built directly: this runs per member
    sha = m["sha256"]
    if type(m["offset"]) is int and type(m["size"]) is int and (sha is None or type(sha) is str):
        return (f'[{encode_str(m["name"])}, {m["offset"]}, {m["size"]}, '
                f'{"null" if sha is None else encode_str(sha)}]')
    return dumps([m["name"], m["offset"], m["size"], sha])


class ShardFingerprint:
    """What decides a shard's bytes: its packs in order; per sample its id, token count, normalized
    conversation, record member, media and extra members (name, offset, size, sha256: the bytes copied, the
    output names and ``_meta``); the profile, max length and tool version. Fed pack by pack, so the writer
    (from a ShardJob) and the skip check (from one catalog query over all shards) compute the same value.
    A member scanned without a hash is known by its place only, so then the source shard's size and mtime
    stand in for its content. The whole context that ``_meta`` carries (profile, settings, tool version) is
    covered; the plan's data fingerprint is not in it, so an incremental plan keeps the untouched output
    shards of the one before."""

    def __init__(self, context: dict) -> None:
        covered = {k: v for k, v in context.items() if k != "shard_fingerprint"}
        self._h = hashlib.sha256(json.dumps(covered, sort_keys=True).encode())

    def pack(self, pack_id: str, media_type: str, total_token_len: int) -> None:
        self._h.update(f"{pack_id}|{media_type}|{total_token_len}\n".encode())

    def sub(self, sample_id: str, token_len: int, conversation_sha256: str | None, json_member: dict | None,
            media: list[dict], extra: list[dict], source_stamp: str | None = None) -> None:
        keys = [member_key(json_member), *map(member_key, media), "+", *map(member_key, extra)]
        unhashed = any(m is not None and m["sha256"] is None for m in [json_member, *media, *extra])
        stamp = source_stamp if unhashed else ""
        self._h.update(f"{sample_id}|{token_len}|{conversation_sha256}|{stamp}|{'|'.join(keys)}\n".encode())

    def text(self, lines: str) -> None:
        """Lines as `pack` and `sub` make them, built elsewhere in bulk (`bulk.build_shard`)."""
        self._h.update(lines.encode())

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:16]


def shard_fingerprint(job: ShardJob, context: dict, fp: ShardFingerprint | None = None) -> str:
    """``fp``: the fingerprint to feed (index mode's covers its roots too); by default copy mode's."""
    fp = ShardFingerprint(context) if fp is None else fp
    for p in job.packs:
        fp.pack(p.pack_id, p.media_type, p.total_token_len)
        for sub in p.subs:
            conv = sub.conversation_sha256 or hashlib.sha256(sub.messages_text().encode()).hexdigest()
            fp.sub(sub.sample_id, sub.token_len, conv, sub.json_member, sub.media, sub.extra, sub.source_stamp)
    return fp.hexdigest()


# members as the structs jobs.shard_job builds, so both sides feed ShardFingerprint the same values
_MEMBER = """{'name': m.name, 'offset': m."offset", 'size': m.size, 'sha256': m.sha256}"""


def _listed(col: str) -> str:
    return f"""SELECT x.sample_id, list({_MEMBER} ORDER BY x.i) AS {col}
                FROM (SELECT sample_id, unnest({col}_members) AS name, generate_subscripts({col}_members, 1) AS i
                      FROM packed) x JOIN members m USING (sample_id, name)
                GROUP BY x.sample_id"""


# /*only*/: every output shard, or (with a list parameter) some of them
_FINGERPRINT_ROWS = f"""WITH packed AS (SELECT DISTINCT pm.sample_id, s.media_members, s.extra_members
                            FROM pack_members pm JOIN samples s USING (sample_id) /*only_packed*/),
                media AS ({_listed("media")}),
                extra AS ({_listed("extra")})
           SELECT p.output_shard, p.pack_id, p.media_type, p.total_token_len, pm.sample_id, t.total_tokens,
                  s.conv_sha, CASE WHEN m.name IS NOT NULL THEN {_MEMBER} END, md.media, ex.extra,
                  sh.size || ':' || sh.mtime_ns
           FROM pack_plan p JOIN pack_members pm USING (pack_id)
           -- hashed before the joins: carried through them, the conversations were most of the memory
           JOIN (SELECT sample_id, shard, json_member, sha256(conversation) AS conv_sha FROM samples) s
             USING (sample_id)
           JOIN token_lengths t USING (sample_id) LEFT JOIN media md USING (sample_id)
           LEFT JOIN extra ex USING (sample_id)
           LEFT JOIN members m ON m.sample_id = s.sample_id AND m.name = s.json_member
           LEFT JOIN shards sh ON sh.shard = s.shard /*only*/
           ORDER BY p.output_shard, p.pack_id, pm.position"""
ONLY = "output_shard IN (SELECT unnest(?::VARCHAR[]))"  # a query's output shards: those of a list parameter


def current_shards(con, out_dir: Path, context: dict, fingerprint=ShardFingerprint,
                   only: set[str] | None = None) -> list[ShardResult]:
    """The output shards already on disk with exactly the planned content (their first pack's
    ``shard_fingerprint``), found with one query over all shards (or the shards ``only``) instead of
    loading each shard's job. ``fingerprint``: the class (or factory) that computes it (index mode's covers
    more). A shard holding a piece of a split sample is never found current here: the query reads whole
    samples only (the writer compares such a shard's fingerprint itself, the audit reads it)."""
    on_disk = {p.name for p in out_dir.glob("*.tar")} if out_dir.is_dir() else set()
    if only is not None:
        on_disk &= only
    on_disk -= piece_shards(con)
    if not on_disk:
        return []
    if only is None:
        cur = con.execute(_FINGERPRINT_ROWS)
    else:
        shards = sorted(on_disk)
        cur = con.execute(_FINGERPRINT_ROWS.replace(
            "/*only_packed*/", f"WHERE pm.pack_id IN (SELECT pack_id FROM pack_plan WHERE {ONLY})").replace(
            "/*only*/", f"WHERE p.{ONLY}"), [shards, shards])
    found: list[ShardResult] = []
    shard = pack = fp = None
    packs = samples = 0

    def close() -> None:
        digest = fp.hexdigest()
        if shard in on_disk and (first_pack_meta(out_dir / shard) or {}).get("shard_fingerprint") == digest:
            found.append(ShardResult(shard, True, (out_dir / shard).stat().st_size, packs, samples, 0.0, digest))

    while rows := cur.fetchmany(65536):
        for name, pack_id, media_type, total, sample_id, tokens, conv_sha, json_member, media, extra, stamp in rows:
            if name != shard:
                if shard is not None:
                    close()
                shard, pack, fp, packs, samples = name, None, fingerprint(context), 0, 0
            if pack_id != pack:
                pack = pack_id
                fp.pack(pack_id, media_type, total)
                packs += 1
            fp.sub(sample_id, tokens, conv_sha, json_member, media or [], extra or [], stamp)
            samples += 1
    if shard is not None:
        close()
    return found
