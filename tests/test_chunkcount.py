"""The chunk -> count cache (core/counting/chunkcount.py) against the plain tokenizers (tests/fixtures/models): Gemma 3
(SentencePiece-style BPE) and the byte-level BPEs (Qwen3-VL's bundled tokenizer.json, InternVL3's and
LLaVA-OneVision's Qwen2 vocab.json + merges.txt as transformers converts them).

Counts must equal the tokenizer's on every text, adversarial ones included; the guard must refuse every
tokenizer definition the proof does not cover."""

from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, pre_tokenizers

from pack_assets.core.counting.chunkcount import (
    BYTE_LEVEL_CHUNK,
    BYTE_LEVEL_PATTERNS,
    SPACE,
    WHITESPACE,
    ChunkCounts,
    split_rule,
    tokenizer_rule,
)


@pytest.fixture(scope="module")
def gemma(family_models) -> Path:
    return family_models["gemma3"]


@pytest.fixture(scope="module")
def spec(gemma) -> dict:
    return json.loads((gemma / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tok(gemma) -> Tokenizer:
    return Tokenizer.from_file(str(gemma / "tokenizer.json"))


def _plain(tok, texts):
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


def _counter(tok, **kw) -> ChunkCounts:
    pattern, glue = tokenizer_rule(tok)
    assert pattern is not None, glue
    return ChunkCounts(pattern, lambda chunks: _plain(tok, chunks), glue, **kw)


def _unknown_chars(spec, n: int = 40) -> list[str]:
    """Characters not in the vocabulary: the BPE writes them as <0xXX> byte tokens."""
    vocab, out = spec["model"]["vocab"], []
    for cp in list(range(0xE000, 0xE100)) + list(range(0x10400, 0x10500)) + list(range(0x1D400, 0x1D500)):
        if chr(cp) not in vocab:
            out.append(chr(cp))
        if len(out) >= n:
            break
    assert out, "no byte-fallback character found"
    return out


def _texts(spec, n: int, seed: int, placeholder: bool = True) -> list[str]:
    """Random texts; ``placeholder=False``: without Gemma's image placeholder (the counters refuse a sample
    whose text writes more placeholders than it has images)."""
    rng = random.Random(seed)
    specials = ["<start_of_turn>", "<end_of_turn>", "<image_soft_token>", "<end_of_image>",
                "<eos>", "<bos>", "<pad>", "<unused3>", "[multimodal]", SPACE * 2, SPACE * 3]
    specials += ["<start_of_image>"] if placeholder else []
    pieces = (["the", "cat", "Hello", "world", "naïve", "café", "日本語", "東京", "😀", "👩‍👩‍👧", "🇫🇷", "e\u0301",
               "</", ">", "<", "</b>", "<b>", "</div>", ">▁</", "> </", "'", ".", ",", "!", "\\", "-", "#", "\u200b",
               "\u00a0", "\u3000", "\r\n", "ü", "ﬁ", "Ω", "١٢٣", "ملف", "x" * 300, "ab" * 400, "ℍ", "\x00", "\x7f"]
              + specials + _unknown_chars(spec))
    seps = [" ", "  ", "   ", "\n", "\n\n", "\t", " \t ", SPACE, SPACE + " ", " " + SPACE, "", "", " \n "]
    out = []
    for _ in range(n):
        k = rng.randint(0, 60)
        out.append("".join(rng.choice(seps) + rng.choice(pieces) for _ in range(k)) + rng.choice(seps))
    return out


FIXED = ["", " ", "  ", "\n", SPACE, SPACE * 40, " " * 40, "a", " a", "a ", "a  b", "a\tb", "a \t b",
         "a>▁</b", "a> </b", "<b> </b>", "x>  </y", "> </", ">▁</", "<end_of_turn> <start_of_turn>",
         "<start_of_turn>user\nhi there<end_of_turn>\n", "▁literal ▁ spaces▁▁and ▁▁▁ runs",
         "word" * 2000, " " + "word" * 2000 + " end", "😀 😀😀  😀", "e\u0301 e\u0301", "\u00a0 \u00a0",
         "<image_soft_token><image_soft_token> <image_soft_token>", "a" + SPACE * 2 + "b" + " " * 2 + "c"]


def test_the_rule_holds_for_gemma3_and_names_its_one_glue_character(spec, tok):
    pattern, glue = split_rule(spec)
    assert pattern is not None, glue
    assert glue == ">"  # the one merge that glues across a cut: ">" + "▁</"
    assert tokenizer_rule(tok) == (pattern, glue)  # the loaded tokenizer's own definition says the same


def test_cached_counts_equal_the_tokenizer_on_adversarial_texts(spec, tok):
    texts = FIXED + _texts(spec, 3000, seed=1)
    counts = _counter(tok, max_entries=5000, max_chunk=40)  # small bounds: clearing and uncached chunks run too
    want = _plain(tok, texts)
    got = []
    for i in range(0, len(texts), 97):
        got.extend(counts.lengths(texts[i:i + 97]))
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, bad[:5]
    assert got == counts.lengths(texts)  # again, from the cache
    assert counts.misses > 0


def test_each_chunk_is_tokenized_apart_as_it_is_in_the_whole(spec, tok):
    """Stronger than equal counts: the ids of the chunks, concatenated, are the ids of the whole text."""
    counts = _counter(tok)
    for text in FIXED + _texts(spec, 500, seed=2):
        chunks = counts.chunks(text)
        assert "".join(chunks) == text
        ids = [i for e in tok.encode_batch(chunks, add_special_tokens=False) for i in e.ids]
        assert ids == tok.encode(text, add_special_tokens=False).ids, (text, chunks)


def test_a_cut_after_the_glue_character_would_be_wrong(tok):
    """The guard's merge check is needed: cutting before every space run, ">" included, miscounts."""
    naive = ChunkCounts(f"[ {SPACE}]*[^ {SPACE}]*", lambda chunks: _plain(tok, chunks))
    texts = ["a> </b", "<p> </p>", "x>▁</y"]
    assert naive.lengths(texts) != _plain(tok, texts)
    assert _counter(tok).lengths(texts) == _plain(tok, texts)


def _image_samples(texts: list[str], rng: random.Random) -> list:
    """One image and a text per user turn, an answer drawn from the same texts: (messages, sizes, videos)."""
    return [([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]},
              {"role": "assistant", "content": [{"type": "text", "text": rng.choice(texts)}]}], [[640, 480]], [])
            for t in texts]


def _outcomes(results) -> list:
    """Counts as they are, rejections as (reason, detail)."""
    return [r if isinstance(r, dict) else (r.reason, r.detail) for r in results]


def _changed(spec, how) -> dict:
    """A copy to change: the model and added tokens copied, the vocabulary and merges copied by the change."""
    s = dict(spec, model=dict(spec["model"]), added_tokens=[dict(t) for t in spec["added_tokens"]])
    how(s)
    return s


@pytest.mark.parametrize("name, how", [
    ("normalizer", lambda s: s.__setitem__("normalizer", {"type": "NFKC"})),
    ("no normalizer", lambda s: s.__setitem__("normalizer", None)),
    ("pre-tokenizer", lambda s: s.__setitem__("pre_tokenizer", {"type": "Metaspace", "replacement": SPACE,
                                                               "prepend_scheme": "first", "split": True})),
    ("model", lambda s: s["model"].__setitem__("type", "Unigram")),
    ("dropout", lambda s: s["model"].__setitem__("dropout", 0.1)),
    ("ignore_merges", lambda s: s["model"].__setitem__("ignore_merges", True)),
    ("prefix", lambda s: s["model"].__setitem__("continuing_subword_prefix", "##")),
    ("byte tokens", lambda s: s["model"].__setitem__("vocab", {k: v for k, v in s["model"]["vocab"].items()
                                                               if k != "<0x41>"})),
    ("normalized added token", lambda s: s["added_tokens"][5].__setitem__("normalized", True)),
    ("lstrip added token", lambda s: s["added_tokens"][5].__setitem__("lstrip", True)),
    ("added token across a cut", lambda s: s["added_tokens"].append(
        {"id": 999999, "content": "a b", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False})),
    ("byte token glued to '▁'", lambda s: s["model"].__setitem__("merges", s["model"]["merges"] + [["<0xE2>", SPACE]])),
    ("byte tokens merged", lambda s: s["model"].__setitem__("merges", s["model"]["merges"] + [["<0xE2>", "<0x96>"]])),
    ("no byte fallback", lambda s: s["model"].__setitem__("byte_fallback", False)),
])
def test_the_guard_refuses_definitions_the_proof_does_not_cover(spec, name, how):
    pattern, why = split_rule(_changed(spec, how))
    assert pattern is None, name
    assert why


def test_a_new_glue_merge_moves_the_rule(spec):
    pattern, glue = split_rule(_changed(spec, lambda s: s["model"].__setitem__(
        "merges", s["model"]["merges"] + [["x", SPACE + "y"]])))
    assert pattern is not None and glue == ">x"


def test_the_guard_refuses_a_tokenizer_that_encodes_special_tokens(tok):
    tok.encode_special_tokens = True
    try:
        assert tokenizer_rule(tok)[0] is None
    finally:
        tok.encode_special_tokens = False


def test_the_fast_rule_counts_through_the_cache_and_equals_the_plain_tokenizer(gemma, spec):
    from pack_assets.core.counting.profiles import profile_from_model_dir
    from pack_assets.core.counting.tokens import TokenCounter

    profile = profile_from_model_dir(gemma)
    cached, plain = TokenCounter(profile), TokenCounter(profile, chunk_cache=False)
    assert cached.chunks is not None and plain.chunks is None
    rng = random.Random(3)
    texts = _texts(spec, 300, seed=4, placeholder=False)
    items = _image_samples(texts, rng)
    got, want = list(cached.count_many(items)), list(plain.count_many(items))
    assert _outcomes(got) == _outcomes(want)
    assert sum(isinstance(r, dict) for r in got) > 280


def test_the_processor_path_counts_through_the_cache_and_equals_the_plain_path(gemma, spec):
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from pack_assets.core.counting.procount import ProcessorCounter, _chunk_counts
    from pack_assets.core.counting.profiles import processor_profile

    pc = ProcessorCounter(processor_profile(gemma))
    assert pc.chunks is not None
    texts = _texts(spec, 200, seed=5, placeholder=False)
    items = [([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}], [[640, 480]], [])
             for t in texts]
    def same(results):
        return [r if isinstance(r, dict) else (r.reason, r.detail) for r in results]

    cached = same(pc.count_many(items))
    assert pc.fallbacks == 0 and pc.direct_counts > 0 and sum(isinstance(r, dict) for r in cached) > 180
    chunks, pc.chunks = pc.chunks, None
    assert same(pc.count_many(items)) == cached
    assert same(pc._safe(pc.count, *item) for item in items[:30]) == cached[:30]  # the whole processor call
    # a call the proof does not cover gets no cache
    assert _chunk_counts(pc.tokenizer, {"add_special_tokens": False, "truncation": True}, pc._media_ids) is None
    assert _chunk_counts(pc.tokenizer, {"add_special_tokens": True}, pc._media_ids) is None
    pc.chunks = chunks



# -- byte-level BPE (proof B) -------------------------------------------------------------------------------------

BYTE_LEVEL = ("qwen3", "internvl", "llava-onevision")


@pytest.fixture(scope="module")
def byte_level(family_models) -> dict[str, Tokenizer]:
    """The byte-level tokenizers of the fixtures, as the counters load them (a ``tokenizers.Tokenizer`` each)."""
    transformers = pytest.importorskip("transformers")
    from pack_assets.core.counting.profiles import bundled_tokenizer_file

    dirs = {f: family_models[f] for f in ("internvl", "llava-onevision")}
    out = {"qwen3": Tokenizer.from_file(str(bundled_tokenizer_file()))}
    for family, d in dirs.items():  # vocab.json + merges.txt: the tokenizers definition transformers builds
        out[family] = transformers.AutoTokenizer.from_pretrained(str(d)).backend_tokenizer
    return out


def _spec_of(tok) -> dict:
    return json.loads(tok.to_str())


def _with(tok, how) -> Tokenizer:
    """A tokenizer whose definition is the given one's, changed."""
    s = _spec_of(tok)
    how(s)
    return Tokenizer.from_str(json.dumps(s))


# the pieces the proof has to get right: contractions (any case), digits, every kind of whitespace before and
# after a " ", NFD text NFC composes (and a combining mark after a space), added tokens glued to words
BL_PIECES = ["the", "cat", "Hello", "'s", "'S", "'t", "'T", "'re", "'LL", "'d", "it's", "DON'T", "'", "''", "'x",
             "1", "42", "2024", "3.14", "1,000", "x2", "日本語", "東京", "한국어", "\u1100\u1161", "ملف", "١٢٣",
             "e\u0301", "\u0301", "A\u030a", "\u212b", "\u0958", "ﬁ", "Ω", "😀", "👩\u200d👩\u200d👧", "🇫🇷",
             "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|endoftext|>",
             "<tool_call>", "</tool_call>", "<think>", "<|im_start", "im_end|>", ".", ",", "!", "?!", "...", "-", "#",
             "//", "(", ")", "\\", "\u200b", "\u180e", "\x00", "\x1c", "\x7f", "\u00ad", "x" * 90, "ab" * 50,
             "\u00a0", "\u3000", "\u2028", "\u2003", "\u0085", "\r", "\r\n", "\n", "\t", "\x0b", "\x0c"]
BL_SEPS = [" ", " ", " ", "  ", "   ", "    ", "", "", "\n", "\n\n", " \n", "\n ", "\n  ", "  \n", "\t", " \t", "\t ",
           "\r\n", " \r\n ", "\u00a0 ", " \u00a0", "\u3000 ", "\u2028 ", "\x1c "]
BL_FIXED = ["", " ", "  ", "   ", "\n", "\n ", " \n", "a", " a", "a ", "a  ", "a   b", "x   y", "a    b", "a\tb",
            "a\t b", "a \t b", "a\n b", "a\n  b", "a \n b", "code:\n    indented line\n    more  ", "it's  THE'S 'T",
            "I'M here 'll do", "12 345  6789", "e\u0301 e\u0301\u0301  a\u030a", " \u0301 \u0301", "a \u0308",
            "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "<|vision_start|>word <|im_end|> end",
            "word<|vision_start|><|image_pad|><|vision_end|>word", "trailing spaces   ", "trailing tab\t", "\t\t x",
            "😀 😀😀  😀", "日本語 東京  한국어", "\u00a0 \u00a0", "\u3000 x", "x\u3000 y", "\x1c x", "a\x1c b",
            "word" * 500, " " + "word " * 300 + " end"]


def _bl_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(BL_SEPS) + rng.choice(BL_PIECES) for _ in range(rng.randint(0, 40)))
            + rng.choice(BL_SEPS) for _ in range(n)]


_RULES: dict[int, tuple] = {}  # id(tokenizer) -> its rule: reading a 150k-token definition takes ~0.5 s


def _bl_counter(tok, **kw) -> ChunkCounts:
    if id(tok) not in _RULES:
        _RULES[id(tok)] = (tok, tokenizer_rule(tok))  # the tokenizer kept too: its id is never reused
    pattern, glue = _RULES[id(tok)][1]
    assert pattern is not None, glue
    return ChunkCounts(pattern, lambda chunks: _plain(tok, chunks), glue, **kw)


def _mismatches(tok, texts, **kw) -> list:
    counts = _bl_counter(tok, **kw)
    got = []
    for i in range(0, len(texts), 89):
        got.extend(counts.lengths(texts[i:i + 89]))
    return [(t, g, w) for t, g, w in zip(texts, got, _plain(tok, texts)) if g != w]


def test_the_byte_level_rule_holds_for_each_fixture_tokenizer(byte_level):
    for name, tok in byte_level.items():
        pattern, glue = tokenizer_rule(tok)
        assert (pattern, glue) == (BYTE_LEVEL_CHUNK, WHITESPACE), (name, glue)
        assert _spec_of(tok)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == BYTE_LEVEL_PATTERNS[0]


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_byte_level_counts_equal_the_tokenizer_on_adversarial_texts(byte_level, name):
    tok = byte_level[name]
    texts = BL_FIXED + _bl_texts(3000, seed=11)
    assert not _mismatches(tok, texts, max_entries=4000, max_chunk=24)[:5]  # small bounds: clearing runs too
    counts = _bl_counter(tok)
    assert counts.lengths(texts) == counts.lengths(texts) == _plain(tok, texts)  # the second from the cache


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_each_byte_level_chunk_is_tokenized_apart_as_it_is_in_the_whole(byte_level, name):
    """Stronger than equal counts: the chunks' ids, put together, are the whole text's ids."""
    tok, counts = byte_level[name], ChunkCounts(BYTE_LEVEL_CHUNK, lambda c: [0] * len(c), WHITESPACE)
    for text in BL_FIXED + _bl_texts(400, seed=12):
        chunks = counts.chunks(text)
        assert "".join(chunks) == text
        assert [c for c in chunks if c] == [c for c in counts._split(text) if c]  # the fast cut is the regex's
        ids = [i for e in tok.encode_batch(chunks, add_special_tokens=False) for i in e.ids]
        assert ids == tok.encode(text, add_special_tokens=False).ids, (text, chunks)


_piece = st.sampled_from(BL_PIECES + BL_SEPS)
_char = st.characters(blacklist_categories=("Cs",))  # a lone surrogate is no str the tokenizer takes
_text = st.lists(st.one_of(_piece, _piece, st.text(_char, max_size=4), _char), max_size=30).map("".join)


@pytest.mark.parametrize("name", BYTE_LEVEL)
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_text, min_size=1, max_size=20))
def test_byte_level_counts_equal_the_tokenizer_on_generated_texts(byte_level, name, texts):
    """Arbitrary code points among the adversarial pieces (hypothesis, derandomized: the same texts each run)."""
    assert not _mismatches(byte_level[name], texts)


def test_the_llama3_pattern_counts_as_the_tokenizer_does(byte_level):
    """The second whitelisted regex (numbers in runs of up to three; Llama 3 has no normalizer), run by the
    tokenizers library on the Qwen vocabulary: the proof does not depend on the vocabulary."""
    def llama3(s):
        s["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = BYTE_LEVEL_PATTERNS[1]
        s["normalizer"] = None
    tok = _with(byte_level["qwen3"], llama3)
    assert tokenizer_rule(tok)[0] == BYTE_LEVEL_CHUNK
    texts = BL_FIXED + _bl_texts(2000, seed=13) + ["1234567 89 1 22 333 4444", "x12345 y"]
    assert not _mismatches(tok, texts)[:5]


def test_llama3s_post_processor_sequence_keeps_the_cache_and_its_counts(byte_level):
    """Llama 3's tokenizer.json post-processes with Sequence[ByteLevel, TemplateProcessing] (a BOS in front):
    neither adds a token at add_special_tokens=False, so the rule holds; a step that is not one of those is
    refused."""
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                          {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]}}}
    byte = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

    def llama3(s):
        s["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = BYTE_LEVEL_PATTERNS[1]
        s["normalizer"] = None
        s["post_processor"] = {"type": "Sequence", "processors": [byte, template]}
    tok = _with(byte_level["qwen3"], llama3)
    assert tok.encode("hi", add_special_tokens=True).ids[0] == 151644  # the template does add its token...
    assert tokenizer_rule(tok)[0] == BYTE_LEVEL_CHUNK  # ...but not at add_special_tokens=False
    assert not _mismatches(tok, BL_FIXED + _bl_texts(1000, seed=15))[:5]

    def other(s):
        llama3(s)
        s["post_processor"]["processors"].append({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                                                  "trim_offsets": True, "add_prefix_space": False})
    assert tokenizer_rule(_with(byte_level["qwen3"], other))[0] is None


def test_an_added_token_that_starts_with_a_space_needs_no_refusal(byte_level):
    """" a" holds no cut (a cut lies before the space, not after it): accepted, and still exact."""
    def add(s):
        s["added_tokens"].append({"id": 151669, "content": " a", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": False})
    tok = _with(byte_level["qwen3"], add)
    assert tokenizer_rule(tok)[0] == BYTE_LEVEL_CHUNK
    assert not _mismatches(tok, BL_FIXED + ["x a", "x  a", "a a a", "\n a", "x\u3000 a"] + _bl_texts(500, seed=14))


def test_a_cut_after_whitespace_would_be_wrong(byte_level):
    """The rule's glue is needed: cutting before every " " (after a space or a newline too) miscounts."""
    tok = byte_level["qwen3"]
    naive = ChunkCounts("[^ ]*| [^ ]*", lambda chunks: _plain(tok, chunks))
    naive._glue = frozenset()  # the fast cut too, at every " "
    texts = ["x   y", "code:\n    indented", "a    b"]
    assert naive.lengths(texts) != _plain(tok, texts)
    assert _bl_counter(tok).lengths(texts) == _plain(tok, texts)


def test_whitespace_holds_the_tokenizers_regex_whitespace():
    """Premise of proof B: W holds every code point Oniguruma's \\s matches (the engine the tokenizer runs)."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    kept = "".join(p for p, _ in pre_tokenizers.Split(Regex(r"\s"), "removed").pre_tokenize_str(every))
    matched = set(every) - set(kept)
    assert " " in matched and "\u3000" in matched and not matched - set(WHITESPACE)


def test_nfc_never_ends_a_piece_in_whitespace_that_was_not():
    """Premise of proof B.2: no character outside W decomposes to one holding W, and no W character is a
    composite (then NFC(a) ends outside W when a does)."""
    for c in range(0x110000):
        d = unicodedata.normalize("NFD", chr(c))
        if any(x in WHITESPACE for x in d):
            assert chr(c) in WHITESPACE and len(d) == 1, hex(c)


_OTHER_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"  # GPT-2's


def _pre(s) -> list:
    return s["pre_tokenizer"]["pretokenizers"]


def _added(content):
    return lambda s: s["added_tokens"].append({"id": 151669, "content": content, "single_word": False,
                                               "lstrip": False, "rstrip": False, "normalized": False,
                                               "special": True})


@pytest.mark.parametrize("name, how", [
    ("another regex", lambda s: _pre(s)[0]["pattern"].__setitem__("Regex", _OTHER_REGEX)),
    ("the regex, one character changed", lambda s: _pre(s)[0]["pattern"].__setitem__(
        "Regex", BYTE_LEVEL_PATTERNS[0].replace(" ?[^", "\\s?[^"))),
    ("a string pattern", lambda s: _pre(s)[0].__setitem__("pattern", {"String": " "})),
    ("merged with previous", lambda s: _pre(s)[0].__setitem__("behavior", "MergedWithPrevious")),
    ("inverted", lambda s: _pre(s)[0].__setitem__("invert", True)),
    ("use_regex", lambda s: _pre(s)[1].__setitem__("use_regex", True)),
    ("add_prefix_space", lambda s: _pre(s)[1].__setitem__("add_prefix_space", True)),
    ("a third pre-tokenizer", lambda s: _pre(s).append({"type": "Digits", "individual_digits": True})),
    ("ByteLevel alone", lambda s: s.__setitem__("pre_tokenizer", _pre(s)[1])),
    ("NFKC", lambda s: s.__setitem__("normalizer", {"type": "NFKC"})),
    ("NFD", lambda s: s.__setitem__("normalizer", {"type": "NFD"})),
    ("lowercase after NFC", lambda s: s.__setitem__("normalizer", {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Lowercase"}]})),
    ("dropout", lambda s: s["model"].__setitem__("dropout", 0.1)),
    ("Roberta post-processor", lambda s: s.__setitem__("post_processor", {
        "type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0], "trim_offsets": True,
        "add_prefix_space": False})),
    ("added token ' a' inside", _added("x a")),
    ("added token ending in a space", _added("<|x|> ")),
    ("normalized added token", lambda s: s["added_tokens"][0].__setitem__("normalized", True)),
    ("rstrip added token", lambda s: s["added_tokens"][3].__setitem__("rstrip", True)),
    ("truncation", lambda s: s.__setitem__("truncation", {"direction": "Right", "max_length": 8, "strategy":
                                                          "LongestFirst", "stride": 0})),
])
def test_the_guard_refuses_byte_level_definitions_the_proof_does_not_cover(byte_level, name, how):
    s = _spec_of(byte_level["qwen3"])
    how(s)
    pattern, why = split_rule(s)
    assert pattern is None, name
    assert why


def _media_free(texts: list[str]) -> list[str]:
    """Without the image placeholder's tokens (a sample writing more placeholders than it has images is refused)."""
    return [t for t in texts if not any(m in t for m in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))]


def test_the_fast_rule_takes_the_cache_on_tiktoken_and_off_it(tmp_path, monkeypatch):
    """A Qwen profile counts through tiktoken and the cache (tiktoken counting the new chunks); forced onto
    tokenizers it takes the cache too; both count as tiktoken does on whole texts."""
    from pack_assets.core.counting.profiles import bundled_tokenizer_file, profile_from_model_dir
    from pack_assets.core.counting.tokens import TokenCounter

    d = tmp_path / "qwen3"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "models" / "Qwen3-VL-8B-Instruct", d)
    shutil.copy(bundled_tokenizer_file(), d / "tokenizer.json")
    profile = profile_from_model_dir(d)
    monkeypatch.setenv("PACK_ASSETS_CACHE", str(tmp_path / "cache"))
    fast, cached = TokenCounter(profile), TokenCounter(profile, backend="tokenizers")
    plain = TokenCounter(profile, chunk_cache=False)
    assert fast.backend == plain.backend == "tiktoken" and plain.chunks is None
    assert fast.chunks is not None and cached.chunks is not None and fast.chunks is not cached.chunks
    texts = _media_free(BL_FIXED + _bl_texts(300, seed=15))
    rng = random.Random(16)
    items = _image_samples(texts, rng)
    want = _outcomes(plain.count_many(items))
    fast.chunks.clear()
    assert _outcomes(cached.count_many(items)) == _outcomes(fast.count_many(items)) == want
    assert _outcomes(fast.count_many(items)) == want  # the second time from the cache
    assert all(isinstance(r, dict) for r in want) and len(want) > 150
    assert cached.chunks.misses > 0 and fast.chunks.misses > 0
    # and on every text alone, the adversarial ones among them (NFC, special tokens, spaces)
    assert fast.lengths(texts) == plain.lengths(texts)


def test_the_byte_level_rule_is_kept_in_the_cache_folder_and_a_damaged_answer_is_decided_again(tmp_path,
                                                                                                monkeypatch):
    """Whether proof B holds is decided once on the loaded tokenizer and kept beside the rank table; a file
    that does not say true or false is decided again."""
    from pack_assets.core.counting import tokenizers
    from pack_assets.core.counting.profiles import load_profile

    p = load_profile("qwen3-vl")
    monkeypatch.setenv("PACK_ASSETS_CACHE", str(tmp_path / "cache"))
    tokenizers.byte_level_chunk_rule.cache_clear()
    assert tokenizers.byte_level_chunk_rule(p.tokenizer_file, p.last_added_id) == (BYTE_LEVEL_CHUNK, WHITESPACE)
    (kept,) = (tmp_path / "cache").glob("chunk-rule-*")
    assert json.loads(kept.read_text()) == {"holds": True}
    kept.write_text('{"holds": "yes"}')
    tokenizers.byte_level_chunk_rule.cache_clear()
    assert tokenizers.byte_level_chunk_rule(p.tokenizer_file, p.last_added_id) == (BYTE_LEVEL_CHUNK, WHITESPACE)
    assert json.loads(kept.read_text()) == {"holds": True}
    kept.write_text('{"holds": false}')  # a kept refusal is taken as it is: the plain tokenizer counts
    tokenizers.byte_level_chunk_rule.cache_clear()
    assert tokenizers.byte_level_chunk_rule(p.tokenizer_file, p.last_added_id) is None
    tokenizers.byte_level_chunk_rule.cache_clear()


def test_the_qwen3_processor_path_counts_through_the_cache_and_equals_the_whole_call(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from pack_assets.core.counting.procount import ProcessorCounter, _chunk_counts
    from pack_assets.core.counting.profiles import bundled_tokenizer_file, processor_profile

    d = tmp_path / "qwen3"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "models" / "Qwen3-VL-8B-Instruct", d)
    shutil.copy(bundled_tokenizer_file(), d / "tokenizer.json")
    pc = ProcessorCounter(processor_profile(d))
    assert pc.chunks is not None
    texts = _media_free(BL_FIXED + _bl_texts(150, seed=17))
    items = [([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]},
               {"role": "assistant", "content": [{"type": "text", "text": t[::-1]}]}], [[640, 480]], [])
             for t in texts]

    def same(results):
        return [r if isinstance(r, dict) else (r.reason, r.detail) for r in results]

    cached = same(pc.count_many(items))
    assert pc.fallbacks == 0 and pc.direct_counts > 0 and all(isinstance(r, dict) for r in cached) and len(cached) > 80
    assert pc.chunks.misses > 0
    chunks, pc.chunks = pc.chunks, None
    try:
        assert same(pc.count_many(items)) == cached
        assert same(pc._safe(pc.count, *item) for item in items[:40]) == cached[:40]  # the whole processor call
    finally:
        pc.chunks = chunks
    assert pc._text_kwargs == {"add_special_tokens": False, "return_token_type_ids": False}  # an output pick only
    for extra in ({"truncation": True}, {"max_length": 8}, {"add_special_tokens": True}):
        assert _chunk_counts(pc.tokenizer, {**pc._text_kwargs, **extra}, pc._media_ids) is None, extra


def test_the_rule_decided_on_the_file_is_the_one_decided_on_the_loaded_tokenizer(tmp_path):
    """Each built-in tokenizer file: proof B decided on the file as on the loaded tokenizer; a file whose added
    token leaves out a flag (which tokenizers itself refuses to load) is refused, no default guessed."""
    from pack_assets.core.counting import tokenizers
    from pack_assets.core.counting.profiles import BUILTIN_PROFILES, load_profile

    files = {}
    for name in BUILTIN_PROFILES:  # each tokenizer file once (several profiles share one)
        p = load_profile(name)
        files.setdefault((p.tokenizer_file, p.last_added_id), (name, p))
    for name, p in files.values():
        loaded = tokenizer_rule(tokenizers.load_tokenizer(p.tokenizer_file, p.last_added_id))[0] == BYTE_LEVEL_CHUNK
        assert tokenizers._rule_holds(p.tokenizer_file, p.last_added_id) is loaded is True, name
    spec = json.loads(Path(p.tokenizer_file).read_text(encoding="utf-8"))
    del spec["added_tokens"][0]["normalized"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    assert tokenizers._rule_holds(str(tmp_path / "tokenizer.json"), p.last_added_id) is False
