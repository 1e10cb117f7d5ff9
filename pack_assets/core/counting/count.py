"""`pack-assets count`: the token counts of records outside shards (a JSON or JSONL file with its media), one
result per record, by the profile's rule."""

from __future__ import annotations

from pathlib import Path

from ..jsonrecords import record_items
from ..reasons import ReasonError
from .counters import counter_for
from .profiles import ModelProfile, resolve_profile


def count_records(path: Path, media_root: Path | None, profile: ModelProfile | str | None = None,
                  model_dir: str | None = None, trust_remote_code: bool = False,
                  chat_template_kwargs: str | dict = "") -> list[dict]:
    """One result per record: counts (``counted_by`` names the rule), or an ``error`` reason with detail.
    ``profile``: a resolved profile, or a built-in name resolved with the other arguments."""
    if not isinstance(profile, ModelProfile):
        profile = resolve_profile(profile, model_dir, trust_remote_code, chat_template_kwargs)
    counter = counter_for(profile)
    out: list[dict] = []
    items: list[tuple] = []
    ids: list[int] = []
    for item in record_items(path, media_root):
        if item.error:
            out.append({"id": item.id, "error": item.error, "detail": item.detail})
            continue
        out.append({"id": item.id})
        items.append((item.messages, item.sizes, item.videos))
        ids.append(len(out) - 1)
    for i, res in zip(ids, counter.count_many(items)):
        if isinstance(res, ReasonError):
            out[i].update(error=res.reason, detail=res.detail)
        else:
            out[i].update(res)
    return out
