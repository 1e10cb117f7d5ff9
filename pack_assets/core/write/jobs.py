"""What the writer writes, as data: the jobs (per output shard its packs, per pack its sub-samples and the
source members to copy), gathered from the plan and the manifest, and a pack's JSON document (conversations
+ ``_meta``), built as bytes. Both output modes write these documents; nothing here touches an output file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import store
from ..split import piece_meta
from ..tario import extra_name, media_name
from .energon import Index

encode_str = json.encoder.encode_basestring  # a str as JSON, ensure_ascii=False (json's C encoder)
_ENCODER = json.JSONEncoder(ensure_ascii=False)
# json's C encoder as `JSONEncoder.encode` builds it per call, built once and without the circular check (what
# it encodes is parsed JSON and the catalog's values, never a cycle): the same text, about half the time
_C_ENCODE = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, _ENCODER.default, encode_str, None, _ENCODER.key_separator, _ENCODER.item_separator, False, False, True)


def dumps(value) -> str:
    """json.dumps(value, ensure_ascii=False)'s text."""
    return "".join(_C_ENCODE(value, 0)) if _C_ENCODE else _ENCODER.encode(value)


@dataclass
class SubSample:
    sample_id: str
    shard: str
    key: str
    source_path: str
    token_len: int
    messages: list | None  # None when messages_json holds them
    json_member: dict | None  # {"name", "offset", "size", "sha256"}
    media: list[dict]  # [{"name", "offset", "size", "sha256"}] in media order
    extra: list[dict] = field(default_factory=list)  # members neither the record nor media, same fields
    conversation_sha256: str | None = None  # of the manifest's normalized conversation text
    source_stamp: str | None = None  # "size:mtime_ns" of the source shard as scanned
    # the manifest's conversation text (json.dumps(messages, ensure_ascii=False), as the scan stored it): spliced
    # into the pack document as is, the same bytes as dumping ``messages`` again, without parsing it first
    messages_json: str | None = None
    split: dict | None = None  # a piece of a split sample (core/split.py): its source and turns, as _meta has it

    def messages_text(self) -> str:
        return self.messages_json if self.messages_json is not None else dumps(self.messages)


@dataclass
class PackJob:
    pack_id: str
    media_type: str
    total_token_len: int
    subs: list[SubSample]


@dataclass
class ShardJob:
    name: str
    packs: list[PackJob]

    @property
    def samples(self) -> int:
        return sum(len(p.subs) for p in self.packs)


@dataclass(frozen=True)
class ShardResult:
    """What became of one planned output shard: written, or found current (``skipped``) and left as it is."""
    shard: str
    skipped: bool
    bytes: int
    packs: int
    samples: int
    seconds: float = 0.0
    fingerprint: str = ""  # its content fingerprint (`_meta`'s shard_fingerprint), where known
    index: Index | None = None  # a shard just written: its Energon index, kept as it was written


# -- the jobs, from the catalog -------------------------------------------------------------------------------

# what the writer reads per output shard, gathered for every shard to write at once (store.staged)
WRITE_ROWS = {
    "subs": """SELECT p.output_shard, pm.pack_id, pm.position, s.sample_id, s.shard, s.key, s.json_member,
                      s.media_members, t.total_tokens, s.extra_members, sh.size || ':' || sh.mtime_ns AS stamp
               FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
               JOIN token_lengths t USING (sample_id) LEFT JOIN shards sh ON sh.shard = s.shard WHERE {shards}""",
    "members": """SELECT p.output_shard, m.sample_id, m.name, m."offset", m.size, m.sha256
                  FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN members m USING (sample_id)
                  WHERE {shards}""",
    # pieces of split samples (core/split.py): their own conversation and media, their source's record
    "pieces": """SELECT p.output_shard, pm.pack_id, pm.position, sp.piece_id, s.shard, s.key, s.json_member,
                        sp.media_members, sp.total_tokens, sp.extra_members, sh.size || ':' || sh.mtime_ns,
                        sp.conversation, sha256(sp.conversation), sp.sample_id, sp.piece, sp.pieces, sp.system,
                        sp.context_start, sp.first_message, sp.end_message
                 FROM pack_plan p JOIN pack_members pm USING (pack_id)
                 JOIN split_pieces sp ON sp.piece_id = pm.sample_id
                 JOIN manifest_samples s ON s.sample_id = sp.sample_id LEFT JOIN shards sh ON sh.shard = s.shard
                 WHERE {shards}""",
    "piece_members": """SELECT p.output_shard, sp.piece_id, m.name, m."offset", m.size, m.sha256
                        FROM pack_plan p JOIN pack_members pm USING (pack_id)
                        JOIN split_pieces sp ON sp.piece_id = pm.sample_id JOIN members m ON m.sample_id = sp.sample_id
                        WHERE {shards}""",
}
# the conversations, most of the bytes, are read per shard (gathered too, they added ~0.8 GB at 1M)
WRITE_CONVERSATIONS = {
    "conversations": """SELECT p.output_shard, s.sample_id, s.conversation, sha256(s.conversation)
                        FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
                        WHERE {shards}""",
}


def shard_job(con, input_root: Path, name: str, rows: store.Staged | None = None) -> ShardJob:
    """Everything the writer needs for one output shard, from the plan and the manifest (one shard at a time, so
    memory follows the output shard size, not the dataset); ``rows``: WRITE_ROWS gathered for every shard."""
    members = {(r[0], r[1]): {"name": r[1], "offset": r[2], "size": r[3], "sha256": r[4]}
               for q in ("members", "piece_members") for r in store.shard_rows(con, WRITE_ROWS, q, name, rows)}
    conversations = {r[0]: r[1:] for r in store.shard_rows(con, WRITE_CONVERSATIONS, "conversations", name)}
    subs: dict[str, list[SubSample]] = {}
    paths: dict[str, str] = {}  # per source shard, not per sample
    for (pack_id, _, sid, shard, key, json_member, media_members, tokens, extra_members,
         stamp) in store.shard_rows(con, WRITE_ROWS, "subs", name, rows, order_by="pack_id, position"):
        if (path := paths.get(shard)) is None:
            path = paths[shard] = str(store.source_tar(input_root, shard))
        conv, conv_sha = conversations[sid]
        subs.setdefault(pack_id, []).append(SubSample(
            sample_id=sid, shard=shard, key=key, source_path=path, token_len=tokens,
            messages=None, messages_json=conv, json_member=members.get((sid, json_member)) if json_member else None,
            media=[members[(sid, n)] for n in media_members or []],
            extra=[members[(sid, n)] for n in extra_members or []], conversation_sha256=conv_sha, source_stamp=stamp,
        ))
    _add_pieces(subs, store.shard_rows(con, WRITE_ROWS, "pieces", name, rows, order_by="pack_id, position"), members,
                lambda shard: paths.get(shard) or paths.setdefault(shard, str(store.source_tar(input_root, shard))))
    packs = con.execute("SELECT pack_id, media_type, total_token_len FROM pack_plan WHERE output_shard = ? "
                        "ORDER BY pack_id", [name]).fetchall()
    return ShardJob(name, [PackJob(pack_id, mt, total, subs[pack_id]) for pack_id, mt, total in packs])


def _add_pieces(subs: dict[str, list[SubSample]], pieces: list[tuple], members: dict, path_of) -> None:
    """The pieces of split samples among a shard's packs, each at its place in its pack."""
    for (pack_id, position, pid, shard, key, json_member, media_members, tokens, extra_members, stamp, conv, conv_sha,
         source, piece, n, system, context_start, first, end) in pieces:
        split = piece_meta(source, piece, n, system, context_start, first, end)
        subs.setdefault(pack_id, []).insert(position, SubSample(
            sample_id=pid, shard=shard, key=key, source_path=path_of(shard), token_len=tokens, messages=None,
            messages_json=conv, json_member=members.get((pid, json_member)) if json_member else None,
            media=[members[(pid, m)] for m in media_members or []],
            extra=[members[(pid, m)] for m in extra_members or []], conversation_sha256=conv_sha, source_stamp=stamp,
            split=split))


def piece_shards(con) -> set[str]:
    """The output shards holding a piece of a split sample. The writer's record does not vouch for these (its
    catalog digest covers whole samples only): they are checked by their fingerprint, which covers each piece."""
    return {r[0] for r in con.execute("SELECT DISTINCT p.output_shard FROM pack_plan p JOIN pack_members pm "
                                      "USING (pack_id) JOIN split_pieces sp ON sp.piece_id = pm.sample_id").fetchall()}


# -- the pack document ------------------------------------------------------------------------------------------


def pack_document(job: PackJob, context: dict, records: list) -> tuple[bytes, list[tuple[str, SubSample, dict]]]:
    """The pack's JSON (conversations + ``_meta``) as bytes and its media members in output order.
    ``records``: each sub-sample's record member bytes (None without one). The text is the bytes
    ``json.dumps(doc, ensure_ascii=False)`` gives for the document dict (samples, then ``PackMeta.as_dict()``),
    built piece by piece: each conversation, already JSON in the manifest, is spliced in instead of parsed and
    dumped again, and ``_meta``'s sources are written without building their dicts (a test checks the bytes
    against json.dumps)."""
    samples, sources, media_out = [], [], []
    pack_id = job.pack_id
    for i, (sub, raw) in enumerate(zip(job.subs, records)):
        names, src_media = _members_out(pack_id, i, sub, sub.media, media_name, media_out)
        # extra members are copied like media; they add no tokens (not in the conversation)
        extra_names, src_extra = _members_out(pack_id, i, sub, sub.extra, extra_name, media_out)
        source = "null"
        if sub.json_member is not None:
            text = str(raw, "utf-8")
            source = dumps(json.loads(text)) if sub.json_member["name"].endswith(".json") else encode_str(text)
        sid = encode_str(sub.sample_id) if type(sub.sample_id) is str else dumps(sub.sample_id)
        # key order as the dict {"sample_id", "token_len", "messages", "media", "source"[, "extra"]} dumps
        samples.append(f'{{"sample_id": {sid}, "token_len": {dumps(sub.token_len)}, '
                       f'"messages": {sub.messages_text()}, "media": {dumps(names)}, "source": {source}'
                       + (f', "extra": {dumps(extra_names)}}}' if sub.extra else "}"))  # only when present
        # SourceRef.as_dict, key for key
        sources.append(f'{{"sample_id": {sid}, "shard": {dumps(sub.shard)}, "key": {dumps(sub.key)}, '
                       f'"json_member": {_member_json(sub.json_member)}, "media": [{", ".join(src_media)}]'
                       + (f', "extra": [{", ".join(src_extra)}]' if sub.extra else "")
                       + (f', "split": {dumps(sub.split)}}}' if sub.split else "}"))
    body = (f'{{"pack_id": {dumps(pack_id)}, "media_type": {dumps(job.media_type)}, '
            f'"samples": [{", ".join(samples)}], "_meta": {_meta(job, sources, context)}}}')
    return body.encode("utf-8"), media_out


def _members_out(pack_id: str, i: int, sub: SubSample, members: list[dict], naming,
                 media_out: list) -> tuple[list, list]:
    """Sub-sample ``i``'s media (or extra) members under their output names: the names the sample lists, and
    each member as ``_meta`` lists it; each (output name, sub-sample, member) is appended to ``media_out``."""
    names, listed = [], []
    for j, m in enumerate(members):
        out_name = naming(pack_id, i, j, m["name"])
        names.append(out_name.split(".", 1)[1])
        media_out.append((out_name, sub, m))
        listed.append(_output_member(m, out_name))
    return names, listed


_MEMBER_KEYS = ("name", "offset", "size", "sha256")
_META_FIXED = {"pack_id", "media_type", "sample_ids", "sample_token_lens", "total_token_len", "sources"}


def _meta(job: PackJob, sources: list[str], context: dict) -> str:
    """PackMeta.as_dict, key for key, the context's items after the fixed ones."""
    meta = (f'{{"pack_id": {dumps(job.pack_id)}, "media_type": {dumps(job.media_type)}, '
            f'"sample_ids": {dumps([s.sample_id for s in job.subs])}, '
            f'"sample_token_lens": {dumps([s.token_len for s in job.subs])}, '
            f'"total_token_len": {dumps(job.total_token_len)}, "sources": [{", ".join(sources)}]')
    return meta_text(meta, context)


def meta_text(meta: str, context: dict) -> str:
    """`_meta` from the text of its fixed keys (``meta``, not closed) and the context's items after them."""
    return meta_closer(context)(meta)


def meta_closer(context: dict):
    """`meta_text` for one context, made once (a shard's packs share it): the context's JSON is made here, not
    per pack."""
    if _META_FIXED & context.keys():  # a context key would replace a fixed one in place, as the dict merge does
        return lambda meta: dumps({**json.loads(meta + "}"), **context})
    rest = dumps(context)[1:-1]
    end = f", {rest}}}" if rest else "}"
    return lambda meta: meta + end


def _member_json(m: dict | None) -> str:
    """json.dumps(m, ensure_ascii=False) of a source member, built directly for the usual
    {"name", "offset", "size", "sha256"} (this runs per member)."""
    if m is not None and tuple(m) == _MEMBER_KEYS and type(m["name"]) is str and type(m["offset"]) is int \
            and type(m["size"]) is int and (m["sha256"] is None or type(m["sha256"]) is str):
        sha = m["sha256"]
        return (f'{{"name": {encode_str(m["name"])}, "offset": {m["offset"]}, "size": {m["size"]}, '
                f'"sha256": {"null" if sha is None else encode_str(sha)}}}')
    return dumps(m)


def _output_member(m: dict, out_name: str) -> str:
    """json.dumps({**m, "output_name": out_name}, ensure_ascii=False): the member as ``_meta`` lists it."""
    if m and "output_name" not in m:
        return f'{_member_json(m)[:-1]}, "output_name": {encode_str(out_name)}}}'
    return dumps({**m, "output_name": out_name})
