"""A pack's sources (its ``_meta``) against the current manifest and its members' bytes: the audit's checks of
one pack read back after its plan row's (core/audit.py `_check_pack`).

`clean_counts` is the common case in one pass: a pack in which neither `check_current` nor `check_media` would
find anything gives its counts there, checked by the very comparisons those two make; any other pack (or one
that would make either raise) gets None, and those two then check it and say what they say, in their order."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

from . import packdoc
from .expected import ShardTexts
from .results import AuditResult

_KINDS = ("media", "extra")


def clean_counts(parts: dict, meta: dict, packed: dict, samples: dict, members: dict, digests: dict) -> Counter | None:
    """`check_media`'s counts of a pack in which `check_current` and `check_media` add no violation (every
    packed conversation the manifest's very text, every record, media and extra member named, sized and hashed
    as the manifest's, no member unlisted); None for any other pack, and for one that would make either raise."""
    try:
        counts = {"media": 0, "media_bytes": 0, "extra": 0, "extra_bytes": 0}
        listed = {"json"}
        for src in meta.get("sources", []):
            sid = src["sample_id"]
            row = samples.get(sid)
            if row is None or len(row) < 8 or packed.get(sid) is not packdoc.SAME:
                return None
            json_name, _, media_names, extra_names = row[4:8]
            jm = src.get("json_member") or {}
            if jm.get("name") != json_name or (json_name and (sha := members.get((sid, json_name), (None, None))[0])
                                                is not None and jm.get("sha256") != sha):
                return None
            for kind, current in zip(_KINDS, (media_names, extra_names)):
                listing = src.get(kind, [])
                if [m.get("name") for m in listing] != list(current or []):
                    return None
                for m in listing:
                    part = m["output_name"].split(".", 1)[1]
                    listed.add(part)
                    data = parts.get(part)
                    if data is None:
                        return None
                    source_sha, source_size = members.get((sid, m["name"]), (None, None))
                    digest = digests.get(part) or hashlib.sha256(data).hexdigest()
                    if (source_size is None or (source_sha is not None and digest != source_sha)
                            or len(data) != source_size or (m.get("sha256") and m["sha256"] != digest)):
                        return None
                    counts[kind] += 1
                    counts[f"{kind}_bytes"] += len(data)
        if not listed.issuperset(parts):
            return None
    except Exception:  # noqa: BLE001 - whatever it is, the two checks raise it themselves
        return None
    return Counter({k: n for k, n in counts.items() if n})


def check_current(res: AuditResult, name: str, key: str, packed: dict, meta: dict, samples: dict,
                  members: dict, texts: ShardTexts) -> None:
    """Each packed sub-sample against the current manifest: its record member (sha256), normalized
    conversation (``packed``: sample id -> its messages, `packdoc.SAME` where the text is the manifest's) and
    member lists; an output older than its source fails here even when the bytes it copied are intact."""
    for src in meta.get("sources", []):
        sid = src.get("sample_id")
        row = samples.get(sid)
        if row is None or len(row) < 8:
            continue  # a sample the plan does not hold: meta_mismatch says so
        json_name, conversation, media_names, extra_names = row[4:8]
        jm = src.get("json_member") or {}
        current_sha = members.get((sid, json_name), (None, None))[0] if json_name else None
        if jm.get("name") != json_name or (current_sha is not None and jm.get("sha256") != current_sha):
            res.add("stale_conversation", f"{sid}: the packed record {jm.get('name')} ({jm.get('sha256')}) is not "
                    f"the current {json_name} ({current_sha})", shard=name, pack_id=key, sample_id=sid)
        elif packed.get(sid) is not packdoc.SAME and packed.get(sid) != json.loads(texts(sid, conversation) or "null"):
            res.add("stale_conversation", f"{sid}: the packed messages differ from the manifest's conversation",
                    shard=name, pack_id=key, sample_id=sid)
        for kind, current in (("media", media_names), ("extra", extra_names)):
            if [m.get("name") for m in src.get(kind, [])] != list(current or []):
                packed_names = [m.get("name") for m in src.get(kind, [])]
                res.add(f"stale_{kind}", f"{sid}: packed {kind} members {packed_names[:5]} are not the current "
                        f"{list(current or [])[:5]}", shard=name, pack_id=key, sample_id=sid)


def check_media(res: AuditResult, name: str, key: str, parts: dict, meta: dict, members: dict,
                digests: dict) -> Counter:
    """Every media and extra member of a pack against its source's size and sha256; returns the counts."""
    counts = {"media": 0, "media_bytes": 0, "extra": 0, "extra_bytes": 0}
    expected_media = set()
    for src in meta.get("sources", []):
        # extra members (neither record nor media) are source bytes too: hashed and counted alike
        for kind in ("media", "extra"):
            for m in src.get(kind, ()):
                output_name = m["output_name"]
                part = output_name.split(".", 1)[1]
                expected_media.add(part)
                data = parts.get(part)
                if data is None:
                    res.add("missing_media", f"{output_name} is named in _meta but absent", shard=name, pack_id=key)
                    continue
                source_sha, source_size = members.get((src["sample_id"], m["name"]), (None, None))
                digest = digests.get(part) or hashlib.sha256(data).hexdigest()
                counts[kind] += 1
                counts[f"{kind}_bytes"] += len(data)
                if source_size is None:
                    res.add("unknown_media", f"{m['name']} of {src['sample_id']} not in members", pack_id=key)
                elif (source_sha is not None and digest != source_sha) or len(data) != source_size:
                    res.add("media_hash_mismatch", f"{output_name}: bytes differ from source {m['name']}",
                            shard=name, pack_id=key)
                if m.get("sha256") and m["sha256"] != digest:
                    res.add("meta_hash_mismatch", f"{output_name}: sha256 differs from _meta", pack_id=key)
    extra = set(parts) - expected_media - {"json"}
    if extra:
        res.add("extra_member", f"pack {key} has members not in _meta: {sorted(extra)[:5]}", pack_id=key)
    return Counter({k: n for k, n in counts.items() if n})
