"""Normalize ShareGPT / LLaVA / "messages" / caption records into one chat form.

The normalized form is what the Qwen-VL chat templates consume: a list of
``{"role": ..., "content": [{"type": "text", "text": ...} | {"type": "image"} | {"type": "video"}]}``.
Media parts appear exactly where the media sits in the conversation.

Placeholder rule (documented in docs/formats.md):
- ``<image>`` / ``<video>`` markers in string content, and typed ``image``/``video`` parts, are placeholders;
- when a conversation has no placeholder of a kind but the sample has media of that kind, all of it goes
  at the start of the first user turn (the LLaVA convention);
- any other difference between placeholders and media is a ``placeholder_mismatch`` rejection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .reasons import ReasonError

ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "function_call": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}
_PLACEHOLDER = re.compile(r"<image>|<video>")
_IMAGE_PART_TYPES = {"image", "image_url", "image_path", "image_binary"}
_VIDEO_PART_TYPES = {"video", "video_url", "video_path"}


@dataclass(frozen=True, slots=True)
class MediaRefs:
    """Media the record itself names (LLaVA ``image``/``images``/``video``/``videos`` fields)."""

    images: list[str]
    videos: list[str]


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, int)):
        return [str(value)]
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, dict):  # {"path": ...} / {"url": ...}
                v = v.get("path") or v.get("url") or v.get("image") or v.get("video")
            if v is not None:
                out.append(str(v))
        return out
    if isinstance(value, dict):
        return _as_list([value])
    return []


def media_refs(record: dict) -> MediaRefs:
    images = _as_list(record.get("image")) + _as_list(record.get("images"))
    videos = _as_list(record.get("video")) + _as_list(record.get("videos"))
    return MediaRefs(images, videos)


def _split_placeholders(text: str) -> list[dict]:
    parts: list[dict] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            parts.append({"type": "text", "text": text[pos : m.start()]})
        parts.append({"type": m.group(0)[1:-1]})
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append({"type": "text", "text": text[pos:]})
    return parts


def _part(item) -> dict | None:
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind in _IMAGE_PART_TYPES or (kind is None and ("image" in item or "image_url" in item)):
        return {"type": "image"}
    if kind in _VIDEO_PART_TYPES or (kind is None and "video" in item):
        return {"type": "video"}
    text = item.get("text", item.get("content") if kind == "text" else None)
    if text is None and kind in (None, "text"):
        text = item.get("value")
    if text is None:
        return None
    return {"type": "text", "text": str(text)}


def _content(value) -> list[dict]:
    if value is None:
        return [{"type": "text", "text": ""}]
    if isinstance(value, str):
        return _split_placeholders(value)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        parts: list[dict] = []
        for item in value:
            p = _part(item)
            if p is None:
                continue
            if p["type"] == "text":
                parts.extend(_split_placeholders(p["text"]))
            else:
                parts.append(p)
        return parts or [{"type": "text", "text": ""}]
    return [{"type": "text", "text": str(value)}]


def _turn(role_raw, content, extra: dict) -> dict:
    role = ROLE_MAP.get(str(role_raw).lower())
    if role is None:
        raise ReasonError("unknown_role", f"unknown role {role_raw!r}")
    msg = {"role": role, "content": _content(content)}
    if extra.get("tool_calls"):
        msg["tool_calls"] = extra["tool_calls"]
    return msg


def normalize(record: dict, caption: str | None = None) -> list[dict]:
    """Turn a record into normalized messages (placeholders as typed parts, not yet matched)."""
    messages: list[dict] = []
    system = record.get("system") or record.get("system_prompt")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    turns = record.get("messages")
    if turns is None:
        turns = record.get("conversations")
    if turns is None:
        turns = record.get("conversation")
    if isinstance(turns, list) and turns:
        for t in turns:
            if not isinstance(t, dict):
                raise ReasonError("bad_turn", f"turn is {type(t).__name__}, not an object")
            role = t.get("role", t.get("from"))
            if role is None:
                raise ReasonError("bad_turn", "turn has neither 'role' nor 'from'")
            content = t["content"] if "content" in t else t.get("value")
            messages.append(_turn(role, content, t))
    else:
        text = caption
        if text is None:
            for k in ("caption", "txt", "text"):
                if isinstance(record.get(k), str):
                    text = record[k]
                    break
        if text is None:
            raise ReasonError("no_conversation", "no 'messages', 'conversations' or caption field")
        # a caption sample: the media is the prompt, the caption the answer
        messages.append({"role": "user", "content": []})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    if not any(m["role"] in ("user", "assistant") for m in messages):
        raise ReasonError("no_conversation", "conversation has no user or assistant turn")
    return messages


def place_media(messages: list[dict], n_images: int, n_videos: int) -> list[dict]:
    """Apply the placeholder rule; raise ``placeholder_mismatch`` when it cannot hold."""
    for kind, n in (("video", n_videos), ("image", n_images)):
        have = sum(1 for m in messages for p in m["content"] if p["type"] == kind)
        if have == n:
            continue
        if have == 0:
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None:
                raise ReasonError("placeholder_mismatch", f"{n} {kind}(s) but no user turn to hold them")
            first_user["content"][:0] = [{"type": kind} for _ in range(n)]
            continue
        raise ReasonError(
            "placeholder_mismatch", f"{have} <{kind}> placeholder(s) for {n} {kind} member(s)"
        )
    for m in messages:
        if not m["content"]:
            m["content"] = [{"type": "text", "text": ""}]
    return messages
