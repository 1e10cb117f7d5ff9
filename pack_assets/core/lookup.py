"""Provenance: a sample id -> its pack and output shard; a pack id -> its sources."""

from __future__ import annotations

from . import store
from .tario import media_name


def _members(con, sample_id: str) -> list[dict]:
    rows = con.execute('SELECT name, "offset", size, sha256 FROM members WHERE sample_id = ? ORDER BY "offset"',
                       [sample_id]).fetchall()
    return [{"name": r[0], "offset": r[1], "size": r[2], "sha256": r[3]} for r in rows]


def _piece(con, piece_id: str) -> dict | None:
    """A piece of a split sample (core/split.py): its source, turns, media, and the pack that holds it."""
    r = con.execute("SELECT sp.sample_id, s.shard, s.key, sp.piece, sp.pieces, sp.first_message, sp.end_message, "
                    "sp.context_start, sp.total_tokens, sp.media_members, pm.pack_id, p.output_shard "
                    "FROM split_pieces sp JOIN manifest_samples s ON s.sample_id = sp.sample_id "
                    "LEFT JOIN pack_members pm ON pm.sample_id = sp.piece_id LEFT JOIN pack_plan p USING (pack_id) "
                    "WHERE sp.piece_id = ?", [piece_id]).fetchone()
    if r is None:
        return None
    return {"source": r[0], "shard": r[1], "key": r[2], "piece": r[3], "pieces": r[4], "turns": [r[5], r[6]],
            "context": [r[7], r[5]], "total_tokens": r[8], "media_members": list(r[9] or []), "pack_id": r[10],
            "output_shard": r[11]}


def lookup(con, ident: str) -> dict:
    """Everything known about a sample id or a pack id; raises KeyError when it is neither."""
    store.check_plan_tables(con)
    pack = con.execute(
        "SELECT pack_id, media_type, sample_ids, sample_token_lens, total_token_len, output_shard FROM pack_plan "
        "WHERE pack_id = ?",
        [ident],
    ).fetchone()
    if pack is not None:
        sources = []
        for pos, sid in enumerate(pack[2]):
            row = con.execute("SELECT shard, key, media_members FROM manifest_samples WHERE sample_id = ?",
                              [sid]).fetchone()
            piece = None if row is not None else _piece(con, sid)
            if piece is not None:  # a piece of a split sample: its source's shard and key, its own media
                row = (piece["shard"], piece["key"], piece["media_members"])
            sources.append({"position": pos, "sample_id": sid, "shard": row[0], "key": row[1],
                            "token_len": pack[3][pos], "media_members": list(row[2] or []),
                            "members": _members(con, piece["source"] if piece else sid),
                            **({"split": piece} if piece else {})})
        return {"kind": "pack", "pack_id": pack[0], "media_type": pack[1], "total_token_len": pack[4],
                "output_shard": pack[5], "sources": sources}
    s = con.execute(
        "SELECT sample_id, shard, key, media_type, status, reason, media_members FROM samples WHERE sample_id = ?",
        [ident]
    ).fetchone()
    if s is None:
        piece = _piece(con, ident)
        if piece is None:
            raise KeyError(f"{ident!r} is neither a sample id nor a pack id")
        return {"kind": "piece", "sample_id": ident, **piece}
    out = {"kind": "sample", "sample_id": s[0], "shard": s[1], "key": s[2], "media_type": s[3], "status": s[4],
           "members": _members(con, ident)}
    if s[4] == "rejected":
        out["outcome"] = "rejected"
        rows = con.execute("SELECT reason, detail FROM rejected WHERE shard = ? AND key = ?", [s[1], s[2]]).fetchall()
        out["reasons"] = [{"reason": r[0], "detail": r[1]} for r in rows] or [{"reason": s[5]}]
        return out
    d = con.execute("SELECT total_tokens, reason FROM dropped WHERE sample_id = ?", [ident]).fetchone()
    if d is not None:
        out.update(outcome="dropped", total_tokens=d[0], reason=d[1])
        return out
    pieces = con.execute("SELECT piece_id FROM split_pieces WHERE sample_id = ? ORDER BY piece", [ident]).fetchall()
    if pieces:
        out.update(outcome="split", pieces=[_piece(con, r[0]) | {"piece_id": r[0]} for r in pieces])
        return out
    lin = con.execute("SELECT pack_id, position, output_shard FROM pack_members JOIN pack_plan USING (pack_id) "
                      "WHERE sample_id = ?", [ident]).fetchone()
    if lin is None:
        out["outcome"] = "not planned (run pack_plan)"
        return out
    pack_id, pos, out_shard = lin
    out.update(outcome="packed", pack_id=pack_id, position=pos, output_shard=out_shard,
               output_members=[f"{pack_id}.json"] + [media_name(pack_id, pos, j, n) for j, n in enumerate(s[6] or [])])
    return out
