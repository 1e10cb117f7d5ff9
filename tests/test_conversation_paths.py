"""The normalizer's shortcuts give what its general paths give: placeholders found by str.find (and by the regex
once a text has many other "<"), the media-token check skipped only where no text holds a "<", media named by
record fields and inline parts."""

from __future__ import annotations

import random
import re

import pytest

from pack_assets.core.conversation import _split_placeholders, media_refs, normalize
from pack_assets.core.reasons import ReasonError

_PLACEHOLDER = re.compile(r"<image>|<video>")


def _by_regex(text: str) -> list[dict]:
    """The regex's cut (the code before the str.find loop)."""
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


def test_placeholders_are_cut_as_the_regex_cuts_them():
    """Texts with no "<", a few placeholders (the str.find loop) and many other "<" (the loop hands over to the
    regex after 8 of them), built from pieces that nearly spell a placeholder."""
    rng = random.Random(53)
    atoms = ["<image>", "<video>", "<", ">", "a", " ", "<im", "age>", "<vid", "eo>", "<<image>", "\n", "é", "<b>"]
    texts = ["", "plain", "<image>", "<image><video>", "<" * 20 + "<image>", "<b>" * 9 + "<video>x<image>"]
    texts += ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 40))) for _ in range(20000)]
    assert sum(t.count("<") - t.count("<image>") - t.count("<video>") >= 8 for t in texts) > 1000
    for t in texts:
        assert _split_placeholders(t) == _by_regex(t), t


@pytest.mark.parametrize("messages_key", ["messages", "conversations"])
def test_a_media_token_after_other_markup_is_still_refused(messages_key):
    """A "<" anywhere in a text sends the messages to the token search, which then finds a token in any of them."""
    turns = [{"role": "user", "content": "a <b> tag"}, {"role": "assistant", "content": "see <|image_pad|>"}]
    if messages_key == "conversations":
        turns = [{"from": t["role"], "value": t["content"]} for t in turns]
    with pytest.raises(ReasonError) as e:
        normalize({messages_key: turns})
    assert e.value.reason == "media_token_in_text"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"},
                                                       {"type": "text", "text": "<IMG_CONTEXT>"}]}]}
    with pytest.raises(ReasonError):
        normalize(parts)
    assert normalize({messages_key: turns[:1]})  # markup alone is text


def test_media_named_by_fields_and_by_inline_parts():
    turns = [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}, {"type": "video", "path": "v.mp4"},
                                          {"type": "text", "text": "q"}]}, {"role": "assistant", "content": "r"}]
    assert media_refs({"messages": turns}) == media_refs({"messages": turns, "images": []})
    refs = media_refs({"messages": turns})
    assert (refs.images, refs.videos) == (["a.jpg"], ["v.mp4"])
    refs = media_refs({"messages": turns, "image": "x.png", "images": ["y.png", {"path": "z.png"}]})
    assert (refs.images, refs.videos) == (["x.png", "y.png", "z.png"], ["v.mp4"])
    refs = media_refs({"conversations": [{"from": "human", "value": "<image>"}], "video": 3, "videos": None})
    assert (refs.images, refs.videos) == ([], ["3"])
    refs = media_refs({"conversations": [{"from": "human", "value": "<image>"}], "images": "one.jpg"})
    assert (refs.images, refs.videos) == (["one.jpg"], [])
