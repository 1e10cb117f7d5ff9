"""Normalize ShareGPT / LLaVA / "messages" / caption records into one chat form.

The normalized form is what the chat templates consume: a list of
``{"role": ..., "content": [{"type": "text", "text": ...} | {"type": "image"} | {"type": "video"}]}``, or for an
HF "messages" turn whose content is a string without a placeholder, that string as the record has it. Every
other key of a turn (``reasoning_content``, ``thinking``, ``name``, ``tool_calls``, ``tool_call_id``, ...)
is kept as the record has it: a template may read it. Media parts appear exactly where the media sits in the
conversation.

Placeholder rule (documented in docs/formats.md):
- ``<image>`` / ``<video>`` markers in string content, and typed ``image``/``video`` parts, are placeholders;
- when a conversation has no placeholder of a kind but the sample has media of that kind, all of it goes
  at the start of the first user turn (the LLaVA convention);
- any other difference between placeholders and media is a ``placeholder_mismatch`` rejection.

HF-native inline media (``{"type": "image", "image": "a.jpg"}``, ``path``/``url``/``image_url``, ``video``)
names the media when the record has no ``image(s)``/``video(s)`` field. A record-level ``tools`` list (or
LLaMA-Factory's JSON string) rides on the first message under ``"tools"`` (the manifest's conversation stays a
list of messages); the count passes it to the template as ``tools=``.
"""

from __future__ import annotations

import json
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
# media tokens of the supported models: a literal one in text would be expanded (or miscounted) by a processor
_MEDIA_TOKEN = re.compile(r"<\|image_pad\|>|<\|video_pad\|>|<image_soft_token>|<start_of_image>|<end_of_image>"
                          r"|<IMG_CONTEXT>|<\|image\|>|<\|video\|>|<\|begin_of_image\|>|<\|begin_of_video\|>")
# a turn's keys the normalizer reads itself; every other key (reasoning_content, thinking, name, tool_call_id,
# tool_calls, ...) reaches the template as the record has it. A turn's own "tools" is dropped: the record's tools
# ride on the first message under that key.
_READ_KEYS = frozenset(("role", "from", "content", "value", "tools"))
_ROLE_CONTENT = frozenset(("role", "content"))


@dataclass(slots=True)
class MediaRefs:
    """Media the record itself names (LLaVA ``image``/``images``/``video``/``videos`` fields). (Not frozen: the
    scan makes two per sample, and a frozen dataclass's __init__ sets each field through object.__setattr__.)"""

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
    """Record-level media fields; for a kind the record has none of, the names its inline parts give."""
    get = record.get  # (the fields are mostly absent: no call for those)
    images = [*_as_list(image), *_as_list(get("images"))] if (image := get("image")) is not None \
        else _as_list(get("images"))
    videos = [*_as_list(video), *_as_list(get("videos"))] if (video := get("video")) is not None \
        else _as_list(get("videos"))
    if not images or not videos:
        inline = inline_refs(record)
        images, videos = images or inline.images, videos or inline.videos
    return MediaRefs(images, videos)


def _part_ref(item: dict, kind: str) -> str:
    """The file an inline media part names ("" when it gives only the kind, or a list of frames)."""
    for k in (kind, f"{kind}_url", f"{kind}_path", "path", "url"):
        v = item.get(k)
        if isinstance(v, dict):
            v = v.get("url") or v.get("path")
        if isinstance(v, str) and v:
            return v
    return ""


def _turns(record: dict):
    for k in ("messages", "conversations", "conversation"):
        if record.get(k) is not None:
            return record[k]
    return None


def inline_refs(record: dict) -> MediaRefs:
    """Media named by typed parts inside the turns, in conversation order (kind-only parts name nothing)."""
    out: dict[str, list[str]] = {"image": [], "video": []}
    turns = _turns(record)
    for t in turns if isinstance(turns, list) else []:
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(content, list):  # (a ShareGPT turn's "value", a string content: no part names media)
            continue
        for item in content:
            p = _part(item) if isinstance(item, dict) else None
            if p is not None and p["type"] in out:
                ref = _part_ref(item, p["type"])
                if ref:
                    out[p["type"]].append(ref)
    return MediaRefs(out["image"], out["video"])


def record_tools(record: dict) -> list[dict] | None:
    """The record's function specs: a list, one object, or LLaMA-Factory's JSON string of either."""
    tools = record.get("tools")
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ReasonError("bad_tools", f"'tools' is a string but not JSON: {e}") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ReasonError("bad_tools", "'tools' is not a list of function objects")
    return tools or None


def _split_placeholders(text: str) -> list[dict]:
    if "<" not in text:  # no placeholder (most turns): no regex scan, no match objects
        return [{"type": "text", "text": text}]
    parts: list[dict] = []
    pos = 0
    at, misses = text.find("<"), 0
    # each "<" found by str.find (memchr), as the regex's matches: a placeholder holds no other "<", so two never
    # overlap; a text with many other "<" (markup, code) goes to the regex's one pass instead
    while at >= 0 and misses < 8:
        if text.startswith("<image>", at) or text.startswith("<video>", at):
            if at > pos:
                parts.append({"type": "text", "text": text[pos:at]})
            parts.append({"type": text[at + 1 : at + 6]})
            pos = at + 7
            at = text.find("<", pos)
        else:
            misses += 1
            at = text.find("<", at + 1)
    for m in _PLACEHOLDER.finditer(text, at) if at >= 0 else ():  # the rest by the regex, from where the loop stopped
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


def _function_call(value) -> list[dict] | None:
    """LLaMA-Factory's ``function_call`` turn (a JSON call or list of calls) as HF ``tool_calls``."""
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return None
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) and "name" in c for c in calls):
        return None
    return [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
            for c in calls]


def _turn(role_raw, content, extra: dict, as_given: bool) -> dict:
    """One message. ``as_given``: an HF "messages" turn, whose string content stays a string when it holds no
    placeholder (templates may test ``content is string``: Qwen3's text template renders a list as "", Qwen3-Omni's
    finds the last query only among strings); ShareGPT ``value`` text becomes typed parts, as before."""
    low = str(role_raw).lower()
    role = ROLE_MAP.get(low)
    if role is None:
        raise ReasonError("unknown_role", f"unknown role {role_raw!r}")
    calls = _function_call(content) if low == "function_call" else None
    if calls:
        content, extra = "", {**extra, "tool_calls": calls}
    keep = as_given and isinstance(content, str) and not _PLACEHOLDER.search(content)
    msg = {"role": role, "content": content if keep else
           _split_placeholders(content) if type(content) is str else _content(content)}  # (_content's, one call less)
    if not extra.keys() <= _READ_KEYS:  # (most turns have only keys read here: no generator for them)
        msg.update((k, v) for k, v in extra.items() if k not in _READ_KEYS)
    if msg.get("tool_calls") and not keep and not any(p.get("text") or p["type"] != "text" for p in msg["content"]):
        msg["content"] = []  # HF's "" / None: the template must see a falsy content (no "\n" before the call)
    return msg


def _texts(content) -> list[str]:
    """The text of a message's content (a string, or its text parts)."""
    if isinstance(content, str):
        return [content]
    return [p.get("text") or "" for p in content if p["type"] == "text"]


def _strings(value):
    """Every string inside a JSON value (keys of objects too: a template may render them)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _kept(message: dict):
    """(key, text) for every string of a message's keys other than role and content (reasoning_content, name,
    tool_calls' names and arguments, the record's tools...)."""
    for key, value in message.items():
        if key not in ("role", "content"):
            for text in _strings(value):
                yield key, text


def _rendered(message: dict):
    """(key, text) for every string of a message a template can render: its content's text, and `_kept`'s."""
    for text in _texts(message["content"]):
        yield "content", text
    yield from _kept(message)


def _has_lt(content) -> bool:
    """Whether a message's content holds a "<" in its text (``_texts``' strings), or is of a kind it does not read."""
    if type(content) is str:
        return "<" in content
    if type(content) is not list:
        return True
    for p in content:
        if type(p) is not dict or p["type"] == "text" and (type(p.get("text")) is not str or "<" in p["text"]):
            return True
    return False


def _check_media_tokens(messages: list[dict]) -> None:
    # one search over every string first (no token holds "\0"); only a hit walks the messages to name it. Every
    # token starts with "<": a text without one (most) needs no regex, and plain messages without one need no join
    for m in messages:
        if m.keys() != _ROLE_CONTENT or _has_lt(m["content"]):
            break
    else:
        return
    texts: list[str] = []
    for m in messages:
        texts += _texts(m["content"])
        if m.keys() != _ROLE_CONTENT:
            texts += [text for _, text in _kept(m)]
    joined = "\0".join(texts)
    if "<" not in joined or not _MEDIA_TOKEN.search(joined):
        return
    for m in messages:
        for key, text in _rendered(m):
            found = _MEDIA_TOKEN.search(text)
            if found:
                where = "text" if key == "content" else f"{key!r}"
                raise ReasonError("media_token_in_text",
                                  f"{m['role']} {where} holds the literal media token {found.group(0)!r}")


def normalize(record: dict, caption: str | None = None) -> list[dict]:
    """Turn a record into normalized messages (placeholders as typed parts, not yet matched)."""
    messages: list[dict] = []
    system = record.get("system") or record.get("system_prompt")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    turns = _turns(record)
    if isinstance(turns, list) and turns:
        for t in turns:
            if not isinstance(t, dict):
                raise ReasonError("bad_turn", f"turn is {type(t).__name__}, not an object")
            role = t.get("role", t.get("from"))
            if role is None:
                raise ReasonError("bad_turn", "turn has neither 'role' nor 'from'")
            as_given = "content" in t
            messages.append(_turn(role, t["content"] if as_given else t.get("value"), t, as_given))
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
    for m in messages:
        if m["role"] in ("user", "assistant"):
            break
    else:
        raise ReasonError("no_conversation", "conversation has no user or assistant turn")
    tools = record_tools(record) if "tools" in record else None  # (None for an absent key too)
    if tools:
        messages[0]["tools"] = tools
    _check_media_tokens(messages)
    return messages


def place_media(messages: list[dict], n_images: int, n_videos: int) -> list[dict]:
    """Apply the placeholder rule; raise ``placeholder_mismatch`` when it cannot hold."""
    types = [p["type"] for m in messages if isinstance(m["content"], list) for p in m["content"]]
    for kind, n in (("video", n_videos), ("image", n_images)):
        have = types.count(kind)
        if have == n:
            continue
        if have == 0:
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None:
                raise ReasonError("placeholder_mismatch", f"{n} {kind}(s) but no user turn to hold them")
            if isinstance(first_user["content"], str):  # the media go before its text, as typed parts
                first_user["content"] = _content(first_user["content"])
            first_user["content"][:0] = [{"type": kind} for _ in range(n)]
            continue
        raise ReasonError(
            "placeholder_mismatch", f"{have} <{kind}> placeholder(s) for {n} {kind} member(s)"
        )
    for m in messages:
        if isinstance(m["content"], list) and not m["content"] and not m.get("tool_calls"):
            m["content"] = [{"type": "text", "text": ""}]
    return messages
