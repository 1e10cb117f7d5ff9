r"""Token counts from a chunk -> count cache, exact by proof: SentencePiece-style BPE (Gemma 3) and byte-level
BPE with the GPT-2-style split regex (Qwen2/2.5/3-VL, InternVL3, LLaVA-OneVision, Llama 3).

Only counts are needed, and natural text repeats its words, so a text is cut into chunks whose tokens
provably do not interact, each distinct chunk is counted once by the real tokenizer, and a text costs a
``str.split`` (or a regex split) plus dict look-ups. Every cut is local: it lies before a " " whose preceding
character is not in a set ``glue`` that ``split_rule`` derives (a cut at the text's start is trivial). Such a
cut stays one in any substring holding both of its characters, so by induction cutting at several of them
keeps the ids of the whole equal to the chunks' ids put together.

A. SentencePiece-style BPE (Gemma 3). The proof, for a Hugging Face ``tokenizers`` definition of this shape
(``split_rule`` checks every premise on the loaded tokenizer's own definition; any other shape gets no cache):

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

B. Byte-level BPE: pre-tokenizer ``Sequence[Split(Regex=P, Isolated, invert=false), ByteLevel(add_prefix_space=
false, use_regex=false)]`` with P one of ``BYTE_LEVEL_PATTERNS`` (exact strings), normalizer NFC or none. The cut
lies between a character x outside ``WHITESPACE`` (W: Python's ``str.isspace`` set plus U+180E, U+200B, once
White_Space; it holds Oniguruma's ``\s``, the Unicode White_Space set, which the tests check on every code
point through the tokenizers library's own regex engine) and a " ":

1. Added tokens: as A.1, with "no added token holds a character outside W followed by a ' '".
2. NFC: " " is a starter (ccc 0) and the second character of no canonical composition, so NFC(a + " " + b)
   = NFC(a) + NFC(" " + b). No character outside W has a W character in its canonical decomposition and no W
   character is a composite (the tests check every code point), so NFC(a) still ends outside W.
3. P has no lookbehind, anchor or ``\b``; its one lookaround is ``(?!\S)``; each alternative consumes at least
   one character and every character starts a match (a letter ``\p{L}+``, a number ``\p{N}``, W ``\s+``, any
   other the `` ?[^\s\p{L}\p{N}]+`` alternative). So the matches tile the piece and each depends only on the
   text from its own start. The match holding x ends at the cut: ``'s``..``'d`` and ``\p{N}`` (Llama 3:
   ``\p{N}{1,3}``) hold no space; ``[^\r\n\p{L}\p{N}]?\p{L}+`` and `` ?[^\s\p{L}\p{N}]+[\r\n]*`` hold a space
   only as their first character (their tails take letters, or \r \n); ``\s*[\r\n]+``, ``\s+(?!\S)`` and
   ``\s+`` hold only W, so not x. Hence a match starts at the cut, and the matches from there are those of the
   right part alone. Those before it are those of the left part alone: each ends at or before the cut, and a
   backtracking engine's choice at a position differs between the text and its left part only through a path
   reading past the cut; a path consuming the " " fails at the left part's end too, and ``(?!\S)`` at the cut
   holds in both (" " is not ``\S``). ByteLevel without its regex only maps each byte to a character.
4. BPE runs on each pre-token alone, so ids(a + b) = ids(a) + ids(b), whatever the vocabulary and merges
   (dropout refused: it is random). A post-processor adds nothing at ``add_special_tokens=False`` (only
   ByteLevel, which changes offsets, and TemplateProcessing are accepted).

So a text's count is the sum of its chunks' counts. tests/test_chunkcount.py compares with the plain tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import filterfalse, repeat
from operator import itemgetter

SPACE = "\u2581"  # SentencePiece's visible space
_SPACES = " " + SPACE
_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
_PRE = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
_BYTE = re.compile(r"<0x[0-9A-F]{2}>")
_last = itemgetter(-1)

# B: the split regexes proven above, exact strings (the Qwen2 vocabulary's: Qwen2/2.5/3-VL, InternVL3,
# LLaVA-OneVision; Llama 3's, numbers in runs of up to three)
BYTE_LEVEL_PATTERNS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# W: Python's str.isspace set (a superset of Unicode White_Space, Oniguruma's \s) + U+180E, U+200B (White_Space
# in old Unicode versions): more characters here only means fewer cuts
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u180e\u200b")
_W = re.escape(WHITESPACE)
# a chunk: its leading whitespace run, then non-W characters, and W runs that start with no " " (a " " after
# a non-W character is a cut); possessive, so the scan stays linear
BYTE_LEVEL_CHUNK = f"[{_W}]*+(?:[^{_W}]++|[{re.escape(WHITESPACE.replace(' ', ''))}][{_W}]*+)*+"
_BYTE_LEVEL_SPLIT = ("type", "pattern", "behavior", "invert")
_BYTE_LEVEL_BYTES = ("type", "add_prefix_space", "trim_offsets", "use_regex")
_POST = (None, "ByteLevel", "TemplateProcessing")  # neither adds a token at add_special_tokens=False


def _byte_level_rule(spec: dict, model: dict) -> tuple[str | None, str]:
    """B's premises (the pre-tokenizer's shape already seen by the caller)."""
    split, byte_level = spec["pre_tokenizer"]["pretokenizers"]
    if sorted(split) != sorted(_BYTE_LEVEL_SPLIT) or split["behavior"] != "Isolated" or split["invert"] is not False:
        return None, f"Split pre-tokenizer {split!r} (only Isolated, not inverted)"
    if (split["pattern"] or {}).get("Regex") not in BYTE_LEVEL_PATTERNS:
        return None, f"split pattern {split['pattern']!r} is not one the proof covers"
    if not set(byte_level) <= set(_BYTE_LEVEL_BYTES) or byte_level.get("add_prefix_space") is not False \
            or byte_level.get("use_regex") is not False:
        return None, f"ByteLevel pre-tokenizer {byte_level!r} (only add_prefix_space=false, use_regex=false)"
    if spec.get("normalizer") not in (None, {"type": "NFC"}):
        return None, f"normalizer {spec.get('normalizer')!r} (only NFC or none)"
    if model.get("dropout"):
        return None, "BPE with dropout"
    post = spec.get("post_processor") or {}
    # Llama 3's is Sequence[ByteLevel, TemplateProcessing]: a sequence of these adds nothing either
    steps = post.get("processors") or [] if post.get("type") == "Sequence" else [post]
    if not steps and post.get("type") == "Sequence" or any((q or {}).get("type") not in _POST for q in steps):
        return None, f"post-processor {post!r}"
    why = _added_tokens_refused(spec, re.compile(f"[^{_W}] "))
    return (None, why) if why else (BYTE_LEVEL_CHUNK, WHITESPACE)


def _added_tokens_refused(spec: dict, inner: re.Pattern) -> str:
    """Why the added tokens break premise 1 (matched on the raw text, none across a cut: ``inner`` finds a
    cut inside a token), or "" when they do not."""
    for t in spec.get("added_tokens") or []:
        if t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return f"added token {t.get('content')!r} is normalized or strips"
        if inner.search(t["content"]):
            return f"added token {t['content']!r} spans a cut"
    return ""


def _is_byte_level(pre) -> bool:
    return (isinstance(pre, dict) and pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or ()) == 2
            and [p.get("type") for p in pre["pretokenizers"]] == ["Split", "ByteLevel"])


def split_rule(spec: dict) -> tuple[str | None, str]:
    """(chunk regex, glue characters: those no cut may follow, besides " " and "▁") for a tokenizer definition
    (tokenizer.json as a dict); (None, why not) when a premise of the proof above does not hold."""
    model = spec.get("model") or {}
    if spec.get("truncation") or spec.get("padding"):  # a padded batch would count every chunk as its longest
        return None, "truncation or padding set"
    if model.get("type") != "BPE":
        return None, "model is not BPE"
    if _is_byte_level(spec.get("pre_tokenizer")):
        return _byte_level_rule(spec, model)
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
    if why := _added_tokens_refused(spec, re.compile(f"[^{_SPACES}][{_SPACES}]")):
        return None, why
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
    long chunks rarely repeat, so 2^18 short keys bound a worker's cache to some tens of MB. The bound still
    keeps a chat template's turn boundary, the words on both sides joined by its special tokens
    ("word.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe", ~90 characters):
    it comes back in nearly every sample, and counted each time it sent the whole text down the slow path.

    ``glue``: the characters no cut may follow (``split_rule``'s), " " and "▁" always among them. A text is first
    cut by ``str.split(" ")`` (several times faster than the regex): every piece but the last is followed by a
    " ", so the cuts are the rule's when the first piece is empty or ends outside the glue (checked) and every
    middle piece does too (``_lead`` holds only such pieces: any other is a KeyError). On a KeyError the pieces
    are checked: a text whose cuts are the rule's is counted by its pieces (one not counted yet, or longer than
    ``max_chunk``, goes to the tokenizer), any other text is cut by the regex.

    Meant for one thread at a time (as the counters that hold it). Every stored value is the tokenizer's
    count of its exact key, so a race could only miss a key (KeyError), never give a wrong count."""

    def __init__(self, pattern: str, count: Callable[[list[str]], list[int]], glue: str = "",
                 max_entries: int = 1 << 18, max_chunk: int = 128):
        self._split = re.compile(pattern).findall
        self._count = count
        self._glue = frozenset(glue + _SPACES)
        self.max_entries, self.max_chunk = max_entries, max_chunk
        self._cache: dict[str, int] = {"": 0}  # chunk -> count ("": findall's last, empty, match)
        self._lead: dict[str, int] = {}  # middle piece of str.split(" ") (ends outside the glue) -> count of " " + it
        self._tail: dict[str, int] = {}  # last piece (any) -> count of " " + it
        self.misses = 0  # chunks sent to the tokenizer

    def clear(self) -> None:
        self._cache, self._lead, self._tail = {"": 0}, {}, {}

    def _pieces_cut(self, text: str) -> bool:
        """Whether every " " of the text is a cut of the rule (so ``str.split(" ")`` cuts it)."""
        parts, glue = text.split(" "), self._glue
        return all(p and p[-1] not in glue for p in parts[1:-1]) and not (parts[0] and parts[0][-1] in glue)

    def chunks(self, text: str) -> list[str]:
        """The chunks a text is counted by (the fast cut's or the regex's)."""
        if not self._pieces_cut(text):
            return self._split(text)
        first, *rest = text.split(" ")
        return [first] + [" " + p for p in rest]

    def lengths(self, texts: list[str]) -> list[int]:
        cache, split, glue, lead = self._cache, self._split, self._glue, self._lead
        get, lead_get, tail_get = cache.__getitem__, lead.__getitem__, self._tail.__getitem__
        out = [0] * len(texts)
        todo: list[tuple[int, int, list[str]]] = []  # (text, sum of its pieces known, chunks to add once counted)
        for i, t in enumerate(texts):
            parts = t.split(" ")
            first, mid = parts[0], parts[1:-1]
            try:
                if len(parts) == 1:
                    out[i] = get(t)
                    continue
                if first and first[-1] in glue:
                    raise KeyError(first)
                out[i] = get(first) + sum(map(lead_get, mid)) + tail_get(parts[-1])
                continue
            except KeyError:  # a cut the rule refuses (the regex's chunks then), or a piece not counted yet
                if len(parts) == 1 or (first and first[-1] in glue) or "" in mid \
                        or not glue.isdisjoint(map(_last, mid)):
                    base, chunks = 0, split(t)
                else:  # the cuts are the rule's (checked in C, cheaper than the regex): only new pieces wait
                    base = sum(map(lead.get, mid, repeat(0)))
                    chunks = [first, " " + parts[-1], *(" " + p for p in filterfalse(lead.__contains__, mid))]
            try:
                out[i] = base + sum(map(get, chunks))
            except KeyError:
                todo.append((i, base, chunks))
        if todo:
            new = list({c: None for _, _, chunks in todo for c in chunks if c not in cache})
            self.misses += len(new)
            fresh = dict(zip(new, self._count(new)))
            cache.update(fresh)  # every new chunk in, for the sums; then the bounds
            for i, base, chunks in todo:
                out[i] = base + sum(map(get, chunks))
            keep, lead, tail = self.max_chunk, self._lead, self._tail
            for c, n in fresh.items():
                if len(c) > keep:
                    cache.pop(c, None)
                elif c[:1] == " " and " " not in c[1:]:
                    tail[c[1:]] = n
                    if len(c) > 1 and c[-1] not in glue:
                        lead[c[1:]] = n
            if len(cache) + len(lead) + len(tail) > self.max_entries:
                self.clear()
        return out
