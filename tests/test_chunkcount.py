"""The chunk -> count cache (core/chunkcount.py) against the plain Gemma 3 tokenizer (tests/fixtures/models).

Counts must equal the tokenizer's on every text, adversarial ones included; the guard must refuse every
tokenizer definition the proof does not cover."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from pack_assets.core.chunkcount import SPACE, ChunkCounts, split_rule, tokenizer_rule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_fixtures import materialize  # noqa: E402


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    return materialize(tmp_path_factory.mktemp("chunks"), ("gemma3",))["gemma3"]


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
    from pack_assets.core.profiles import profile_from_model_dir
    from pack_assets.core.tokens import TokenCounter

    profile = profile_from_model_dir(gemma)
    cached, plain = TokenCounter(profile), TokenCounter(profile, chunk_cache=False)
    assert cached.chunks is not None and plain.chunks is None
    rng = random.Random(3)
    texts = _texts(spec, 300, seed=4, placeholder=False)
    items = [([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]},
               {"role": "assistant", "content": [{"type": "text", "text": rng.choice(texts)}]}], [[640, 480]], [])
             for t in texts]
    got, want = list(cached.count_many(items)), list(plain.count_many(items))
    assert [r if isinstance(r, dict) else (r.reason, r.detail) for r in got] == \
        [r if isinstance(r, dict) else (r.reason, r.detail) for r in want]
    assert sum(isinstance(r, dict) for r in got) > 280


def test_the_processor_path_counts_through_the_cache_and_equals_the_plain_path(gemma, spec):
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from pack_assets.core.procount import ProcessorCounter, _chunk_counts
    from pack_assets.core.profiles import processor_profile

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
