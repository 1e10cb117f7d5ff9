"""What every family's sample encoder shares: the media of a sub-sample split by kind, and the rendered text
tokenized with, per token, whether the label policy trains it."""

from __future__ import annotations

import bisect
import re

from ._core import VIDEO_EXTS, labels

VIDEO_SUFFIXES = tuple(f".{e}" for e in sorted(VIDEO_EXTS))


def split_media(media: list[tuple[str, bytes]]) -> tuple[list[bytes], list[bytes]]:
    """(images, videos) of a sub-sample's (part name, bytes), each in member order: the order the template's
    placeholders take them in."""
    images = [data for name, data in media if not name.endswith(VIDEO_SUFFIXES)]
    videos = [data for name, data in media if name.endswith(VIDEO_SUFFIXES)]
    return images, videos


def tokens_and_trainable(
    tok, text: str, policy: str, assistant: re.Pattern = labels.ASSISTANT, carried: int = 0
) -> tuple[list[int], list[bool]]:
    """The ids of ``text`` (no special tokens added: the template writes them) and, per id, whether its first
    character lies in a span ``policy`` trains (``assistant``: the family's assistant-turn pattern; ``carried``:
    leading assistant turns that are a piece's context, never trained)."""
    enc = tok.encode(text, add_special_tokens=False)
    spans = labels.trainable_spans(text, policy, assistant, carried)
    starts, ends = [a for a, _ in spans], [b for _, b in spans]
    trainable = []
    for start, _ in enc.offsets:
        k = bisect.bisect_right(starts, start) - 1
        trainable.append(k >= 0 and start < ends[k])
    return enc.ids, trainable
