"""Token counts of a SentencePiece-style BPE (Gemma 3) from a chunk -> count cache, exact by proof.

Only counts are needed, and natural text repeats its words, so a text is cut into chunks whose tokens
provably do not interact, each distinct chunk is counted once by the real tokenizer, and a text costs a regex
split plus dict look-ups.

The proof, for a Hugging Face ``tokenizers`` definition of this shape (``split_rule`` checks every premise on
the loaded tokenizer's own definition; any other shape gets no cache):

1. Added tokens are matched first, on the raw text (all ``normalized: false``, no lstrip/rstrip/single_word),
   leftmost-longest. A cut between a character x outside {" ", "▁"} and a character in it lies inside no match
   when no added token contains such a pair; then the matches of a+b are those of a and of b.
2. The normalizer only replaces " " by "▁", character by character, so it commutes with the cut; the
   pre-tokenizer splits on " " (none is left after the normalizer) or is absent: each piece between added
   tokens is one BPE word.
3. BPE (no dropout, no ``ignore_merges``, no prefix/suffix) starts from one symbol per character (or its
   ``<0xXX>`` bytes) and repeatedly applies the lowest-ranked merge of an adjacent pair, leftmost first. Until a
   merge joins the symbol ending at the cut (last character x) with the one starting at it (first character
   "▁"), the two sides evolve exactly as they would alone. Such a merge (L, R) has R starting with "▁" and L
   ending with x. So cutting only where x is not the last character of any merge's L whose R starts with "▁"
   (Gemma 3: one merge, ">" + "▁</") keeps the ids of a+b equal to those of a then b. An x outside the
   vocabulary is a byte symbol, and byte symbols are in no merge (checked); byte fallback covers every byte
   and "▁" is a vocabulary symbol, so no <unk> fusion crosses the cut.

So a text's count is the sum of its chunks' counts. tests/test_chunkcount.py compares with the plain tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

SPACE = "\u2581"  # SentencePiece's visible space
_SPACES = " " + SPACE
_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
_PRE = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
_BYTE = re.compile(r"<0x[0-9A-F]{2}>")


def split_rule(spec: dict) -> tuple[str | None, str]:
    """(chunk regex, glue characters) for a tokenizer definition (tokenizer.json as a dict); (None, why not)
    when a premise of the proof above does not hold."""
    model = spec.get("model") or {}
    if spec.get("truncation") or spec.get("padding"):  # a padded batch would count every chunk as its longest
        return None, "truncation or padding set"
    if model.get("type") != "BPE":
        return None, "model is not BPE"
    if model.get("dropout") or model.get("ignore_merges") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        return None, "BPE with dropout, ignore_merges or a subword prefix/suffix"
    if spec.get("normalizer") != _NORMALIZER:
        return None, f"normalizer {spec.get('normalizer')!r}"
    if spec.get("pre_tokenizer") not in (None, _PRE):
        return None, f"pre_tokenizer {spec.get('pre_tokenizer')!r}"
    vocab = model.get("vocab") or {}
    if SPACE not in vocab:
        return None, "no '▁' in the vocabulary"
    if not model.get("byte_fallback") or not all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return None, "no byte fallback over all 256 byte tokens (an unknown character could fuse into <unk>)"
    inner = re.compile(f"[^{_SPACES}][{_SPACES}]")
    for t in spec.get("added_tokens") or []:
        if t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return None, f"added token {t.get('content')!r} is normalized or strips"
        if inner.search(t["content"]):
            return None, f"added token {t['content']!r} spans a cut"
    glue: set[str] = set()  # last characters of a merge's left part whose right part starts with "▁"
    for m in model.get("merges") or []:
        left, right = m if isinstance(m, list) else m.split(" ", 1)
        for part in (left, right):  # a byte symbol never merges: the one ending at a cut stays alone
            if len(part) == 6 and part.startswith("<0x") and _BYTE.fullmatch(part):
                return None, f"a byte token merges: {left!r} + {right!r}"
        if right.startswith(SPACE) and not left.endswith(SPACE):
            glue.add(left[-1])
    if " " in glue:  # impossible after the normalizer, but the rule below relies on it
        return None, "a merge glues ' ' to '▁'"
    no_cut = re.escape("".join(sorted(glue)))
    # a chunk: its leading run of spaces, then characters, where a glue character keeps the run after it
    pattern = f"[{_SPACES}]*(?:[^{_SPACES}{no_cut}]|[{no_cut}][{_SPACES}]*)*" if glue else \
        f"[{_SPACES}]*[^{_SPACES}]*"
    return pattern, "".join(sorted(glue))


def tokenizer_rule(tokenizer) -> tuple[str | None, str]:
    """``split_rule`` of a loaded ``tokenizers.Tokenizer`` (its own serialized definition, not the file)."""
    if getattr(tokenizer, "encode_special_tokens", False):
        return None, "encode_special_tokens is on"
    return split_rule(json.loads(tokenizer.to_str()))


class ChunkCounts:
    """Per-text sums of per-chunk values, each distinct chunk computed once by ``count`` (a batch of chunks ->
    one int each). Bounded: emptied when it holds ``max_entries``; chunks longer than ``max_chunk`` characters
    (a URL, a line of code, text without spaces) are counted every time, never kept: words are short, and
    long chunks rarely repeat, so 2^18 short keys bound a worker's cache to some tens of MB.

    ``glue``: the characters no cut may follow (``split_rule``'s). A text with no "  ", no "▁" and no glue
    character before " " is cut by ``str.split(" ")`` (every cut then falls between a plain character and
    one space, a cut of the rule; several times faster than the regex); any other text by the regex.

    Meant for one thread at a time (as the counters that hold it). Every stored value is the tokenizer's
    count of its exact key, so a race could only miss a key (KeyError), never give a wrong count."""

    def __init__(self, pattern: str, count: Callable[[list[str]], list[int]], glue: str = "",
                 max_entries: int = 1 << 18, max_chunk: int = 64):
        self._split = re.compile(pattern).findall
        self._count = count
        self._needles = ("  ", SPACE) + tuple(g + " " for g in glue)
        self.max_entries, self.max_chunk = max_entries, max_chunk
        self._cache: dict[str, int] = {"": 0}  # chunk -> count ("": findall's last, empty, match)
        self._lead: dict[str, int] = {}  # piece of str.split(" ") -> count of " " + piece
        self.misses = 0  # chunks sent to the tokenizer

    def clear(self) -> None:
        self._cache, self._lead = {"": 0}, {}

    def chunks(self, text: str) -> list[str]:
        """The chunks a text is counted by (the fast cut's or the regex's)."""
        if any(n in text for n in self._needles):
            return self._split(text)
        first, *rest = text.split(" ")
        return [first] + [" " + p for p in rest]

    def lengths(self, texts: list[str]) -> list[int]:
        cache, lead, split, needles = self._cache, self._lead, self._split, self._needles
        get, lead_get = cache.__getitem__, lead.__getitem__
        out = [0] * len(texts)
        todo: list[tuple[int, list[str]]] = []
        for i, t in enumerate(texts):
            if any(n in t for n in needles):
                chunks = split(t)
                try:
                    out[i] = sum(map(get, chunks))
                except KeyError:
                    todo.append((i, chunks))
            else:
                first, *rest = t.split(" ")
                try:
                    out[i] = get(first) + sum(map(lead_get, rest))
                except KeyError:
                    todo.append((i, [first] + [" " + p for p in rest]))
        if todo:
            new = list({c: None for _, chunks in todo for c in chunks if c not in cache})
            self.misses += len(new)
            fresh = dict(zip(new, self._count(new)))
            cache.update(fresh)  # every new chunk in, for the sums; then the bounds
            for i, chunks in todo:
                out[i] = sum(map(get, chunks))
            keep = self.max_chunk
            for c, n in fresh.items():
                if len(c) > keep:
                    cache.pop(c, None)
                elif c[:1] == " " and " " not in c[1:]:
                    lead[c[1:]] = n
            if len(cache) + len(lead) > self.max_entries:
                self.clear()
        return out
