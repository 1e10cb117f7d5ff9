"""Token counts against oracles from transformers itself: its Qwen-VL image processor (PIL backend, no
torch) and apply_chat_template with the real checkpoint templates from ../shared/fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pack_assets.core.counting.profiles import (
    BUILTIN_PROFILES,
    ProfileError,
    bundled_tokenizer_file,
    load_profile,
    profile_from_model_dir,
)
from pack_assets.core.counting.tokenizers import tokenizer_for
from pack_assets.core.counting.tokens import TokenCounter
from pack_assets.core.counting.vision import image_tokens, video_count
from pack_assets.core.reasons import ReasonError

# copies of ../shared/fixtures (tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
CHECKPOINTS = {"qwen2-vl": "Qwen2-VL-7B-Instruct", "qwen2.5-vl": "Qwen2.5-VL-7B-Instruct",
               "qwen3-vl": "Qwen3-VL-8B-Instruct"}

SIZES = [(1, 1), (1, 199), (1, 200), (3, 599), (10, 10), (27, 29), (28, 28), (56, 56), (57, 1000), (100, 20000),
         (224, 224), (333, 777), (640, 480), (1023, 1), (1280, 720), (1920, 1080), (3000, 4000), (4000, 300),
         (5000, 5000), (8000, 40), (12000, 9000), (16384, 16384), (37, 1000)]


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_image_tokens_equal_the_transformers_image_processor(profile):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil.from_pretrained(FIXTURES / CHECKPOINTS[profile])
    rule = load_profile(profile).image
    rng = np.random.default_rng(0)
    sizes = SIZES + [tuple(int(x) for x in rng.integers(1, 6000, 2)) for _ in range(300)]
    for w, h in sizes:
        if max(w, h) / min(w, h) > 200:
            with pytest.raises(ReasonError) as e:
                image_tokens(w, h, rule)
            assert e.value.reason == "image_aspect_ratio"
            continue
        expected = proc.get_number_of_image_patches(h, w, {}) // rule.merge_size**2
        assert image_tokens(w, h, rule) == expected, (profile, w, h)


def test_image_grid_from_really_processing_small_images():
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    for profile in ("qwen2.5-vl", "qwen3-vl"):
        proc = Qwen2VLImageProcessorPil.from_pretrained(FIXTURES / CHECKPOINTS[profile])
        rule = load_profile(profile).image
        for w, h in [(1, 1), (37, 1000), (300, 200), (64, 640)]:
            grid = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0]
            assert int(np.prod(grid)) // rule.merge_size**2 == image_tokens(w, h, rule)


def _conversations() -> list[list[dict]]:
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    img, vid = {"type": "image"}, {"type": "video"}
    return [
        [{"role": "user", "content": [t("Hi")]}, {"role": "assistant", "content": [t("Hello!")]}],
        [{"role": "system", "content": [t("You are terse.")]}, {"role": "user", "content": [img, t("\nWhat is it?")]},
         {"role": "assistant", "content": [t("A cat.")]}],
        [{"role": "user", "content": [img, img, img, t("Compare these three.")]},
         {"role": "assistant", "content": [t("First is red.\n\nSecond is blue.")]},
         {"role": "user", "content": [t("And the third?")]}, {"role": "assistant", "content": [t("Green.")]}],
        [{"role": "user", "content": [vid, t("What happens in the video?")]},
         {"role": "assistant", "content": [t("A ball bounces.")]}],
        [{"role": "user", "content": [t("")]}, {"role": "assistant", "content": [t("")]}],
        [{"role": "user", "content": [t("Ünïcödé ✓ 数据 🙂 — \"quotes\" <think> </think> <tool_call>")]},
         {"role": "assistant", "content": [t("ok\n")]}],
        [{"role": "user", "content": [t("Weather in Paris?")]},
         {"role": "assistant", "content": [t("Let me check.")]},
         {"role": "tool", "content": [t('{"temp": 21}')]},
         {"role": "tool", "content": [t('{"sky": "clear"}')]},
         {"role": "assistant", "content": [t("21 °C and clear.")]}],
        [{"role": "user", "content": [t("\nleading newline"), img]},
         {"role": "assistant", "content": [t("  spaces  ")]}],
    ]


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_rendering_equals_apply_chat_template_with_the_checkpoint_template(profile):
    from transformers import PreTrainedTokenizerFast

    folder = FIXTURES / CHECKPOINTS[profile]
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(bundled_tokenizer_file()))
    counter = TokenCounter(load_profile(profile))
    assert counter.profile.chat_template == template
    for conv in _conversations():
        expected = tok.apply_chat_template(conv, chat_template=template, tokenize=False)
        assert counter.render(conv) == expected


def test_qwen3_vl_counts_equal_transformers_tokenization_of_the_rendered_conversation():
    from transformers import PreTrainedTokenizerFast

    template = json.loads((FIXTURES / CHECKPOINTS["qwen3-vl"] / "chat_template.json").read_text())["chat_template"]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(bundled_tokenizer_file()))
    counter = TokenCounter(load_profile("qwen3-vl"))
    convs = [c for c in _conversations() if not any(p["type"] == "video" for m in c for p in m["content"])]
    sizes = [[300, 200]] * 3
    results = list(counter.count_many((c, sizes[: sum(p["type"] == "image" for m in c for p in m["content"])], [])
                                      for c in convs))
    for conv, res in zip(convs, results):
        n_img = sum(p["type"] == "image" for m in conv for p in m["content"])
        ids = tok.apply_chat_template(conv, chat_template=template, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        per_image = image_tokens(300, 200, counter.profile.image)
        assert res["total_tokens"] == len(ids) - n_img + n_img * per_image
        assert res["image_tokens"] == n_img * per_image


def test_qwen2_family_tokenizers_have_their_own_added_tokens_only():
    q3, q25, q2 = (tokenizer_for(load_profile(p)) for p in ("qwen3-vl", "qwen2.5-vl", "qwen2-vl"))
    assert q3.get_vocab_size(with_added_tokens=True) == 151669
    assert len(q3.encode("<think>", add_special_tokens=False).ids) == 1
    assert len(q25.encode("<think>", add_special_tokens=False).ids) > 1  # plain text in Qwen2.5-VL
    assert len(q25.encode("<tool_call>", add_special_tokens=False).ids) == 1
    assert len(q2.encode("<tool_call>", add_special_tokens=False).ids) > 1
    assert q2.encode("<|image_pad|>", add_special_tokens=False).ids == [151655]
    text = "plain words, numbers 12345 and 数据"
    assert q3.encode(text).ids == q25.encode(text).ids == q2.encode(text).ids


def test_qwen25_adds_the_default_system_turn_qwen3_does_not():
    conv = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert "You are a helpful assistant." in TokenCounter(load_profile("qwen2.5-vl")).render(conv)
    assert "system" not in TokenCounter(load_profile("qwen3-vl")).render(conv)


def test_qwen3_video_rule_follows_the_documented_processor_behaviour():
    rule = load_profile("qwen3-vl").video
    # 10 s at 30 fps: int(300/30*2) = 20 frames -> grid_t 10; 640x480 -> 640x480 (multiples of 32)
    vc = video_count({"frames": 300, "fps": 30.0, "width": 640, "height": 480}, rule)
    assert len(vc.timestamps) == 10
    assert vc.pad_tokens == 10 * ((480 // 32) * (640 // 32) + 2)
    idx = np.linspace(0, 299, 20).round().astype(int)
    assert vc.timestamps[0] == f"<{(idx[0] / 30 + idx[1] / 30) / 2:.1f} seconds>"
    # very short video: at least min_frames (4) but never more than it has
    short = video_count({"frames": 3, "fps": 30.0, "width": 64, "height": 64}, rule)
    assert len(short.timestamps) == 2  # 3 frames -> padded to 4 -> grid_t 2
    with pytest.raises(ReasonError):
        video_count({"frames": 1, "fps": 30.0, "width": 64, "height": 64}, rule)


def test_qwen25_video_rule_is_qwen_vl_utils_fps2():
    rule = load_profile("qwen2.5-vl").video
    # 10 s at 30 fps -> 20 frames at fps 2 -> 10 temporal groups; 640x480 within per-frame pixel caps
    vc = video_count({"frames": 300, "fps": 30.0, "width": 640, "height": 480}, rule)
    h, w = round(480 / 28) * 28, round(640 / 28) * 28
    assert vc.pad_tokens == 10 * (h // 28) * (w // 28) and vc.timestamps == ()


def test_counts_add_up_and_video_timestamps_are_tokenized():
    counter = TokenCounter(load_profile("qwen3-vl"))
    conv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Nothing."}]}]
    meta = {"frames": 40, "fps": 10.0, "width": 128, "height": 96}
    (res,) = counter.count_many([(conv, [], [meta])])
    vc = video_count(meta, counter.profile.video)
    stamps = sum(len(counter.tokenizer.encode(s, add_special_tokens=False).ids) for s in vc.timestamps)
    assert res["video_tokens"] == vc.pad_tokens + stamps
    assert res["total_tokens"] == res["text_tokens"] + res["image_tokens"] + res["video_tokens"]
    rendered = len(counter.tokenizer.encode(counter.render(conv), add_special_tokens=False).ids)
    assert res["text_tokens"] == rendered - 1


def test_unsupported_profile_and_model_dir_errors_list_the_supported(tmp_path):
    with pytest.raises(ProfileError, match="qwen3-vl"):
        load_profile("llava-1.5")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ProfileError, match="qwen2_5_vl"):
        profile_from_model_dir(tmp_path)


def test_model_dir_follows_the_checkpoint_files(tmp_path):
    import shutil

    for f in (FIXTURES / CHECKPOINTS["qwen3-vl"]).iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "preprocessor_config.json").read_text())
    cfg["size"]["longest_edge"] = 256 * 32 * 32  # a user who caps images at 256 tokens
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(cfg))
    p = profile_from_model_dir(tmp_path)
    assert p.family == "qwen3-vl" and p.image.max_pixels == 256 * 32 * 32
    assert image_tokens(4000, 3000, p.image) <= 256
    assert p.fingerprint != load_profile("qwen3-vl").fingerprint
    assert math.isclose(p.video.fps, 2.0)


def _corpus() -> list[str]:
    import random
    import unicodedata

    from pack_assets.core.demo import WORDS

    rng = random.Random(0)
    alphabet = "abc XYZ 0123456789 数据图像 описание größe café naïve 🙂👍🏽\n\t\r  's 're 'LL \u00a0\u200b<>{}[]\"\\"
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<think>", "</think>", "<tool_call>",
                "<tool_response>", "<|endoftext|>", "<|fim_prefix|>"]
    texts = []
    for _ in range(1500):
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        texts += [t, unicodedata.normalize("NFD", t), " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 80))),
                  rng.choice(specials).join(rng.choice(WORDS) for _ in range(4))]
    counter = TokenCounter(load_profile("qwen3-vl"), backend="tokenizers")
    texts += [counter.render(c) for c in _conversations()]
    return texts


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_tiktoken_backend_gives_the_same_ids_as_hf_tokenizers(profile):
    import unicodedata

    p = load_profile(profile)
    fast = TokenCounter(p)
    assert fast.backend == "tiktoken"
    hf = tokenizer_for(p)
    for text in _corpus():
        expected = hf.encode(text, add_special_tokens=False).ids
        assert fast.fast.encode(unicodedata.normalize("NFC", text), allowed_special="all") == expected, repr(text[:60])


def test_the_rank_table_is_saved_once_and_read_back_equal_and_a_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    """The tiktoken table kept in the cache folder (core/counting/tokenizers.py) counts exactly as the one built from
    tokenizer.json; a damaged or unwritable cache never changes a count."""
    from pack_assets.core.counting import tokenizers

    p = load_profile("qwen2.5-vl")
    texts = _corpus()[:400]
    built = tokenizers._bpe_ranks(json.loads(Path(p.tokenizer_file).read_text()), p.last_added_id)

    def counter():
        tokenizers._fast_counter.cache_clear()
        return tokenizers.fast_counter_for(p)

    def ids(enc):
        return [enc.encode(t, allowed_special="all") for t in texts]

    monkeypatch.setenv("PACK_ASSETS_CACHE", str(tmp_path / "cache"))
    first = ids(counter())  # built, then saved
    saved = list((tmp_path / "cache").iterdir())
    assert len(saved) == 1
    assert tokenizers._cached_ranks(p.tokenizer_file, p.last_added_id) == built  # pattern, every rank, added tokens
    assert ids(counter()) == first
    data = bytearray(saved[0].read_bytes())
    data[-10] ^= 0xFF  # one rank's bytes damaged: the checksum refuses the file, the table is built again
    saved[0].write_bytes(bytes(data))
    assert tokenizers._cached_ranks(p.tokenizer_file, p.last_added_id) is None
    assert ids(counter()) == first
    assert tokenizers._cached_ranks(p.tokenizer_file, p.last_added_id) == built  # and saved again, whole
    (tmp_path / "ro").write_text("a file where the folder should be")
    monkeypatch.setenv("PACK_ASSETS_CACHE", str(tmp_path / "ro" / "cache"))
    assert ids(counter()) == first
    tokenizers._fast_counter.cache_clear()


def test_counting_the_scan_from_memory_writes_the_files_counting_from_disk_writes(tmp_path):
    """The helpers count a shard from the scan they just wrote (its messages as parsed): the same token_lengths
    files as a count that reads the manifest back; and a scan kept in memory that is no longer the one on disk
    (the shard was scanned again since) is not used."""
    import pyarrow.parquet as pq
    from conftest import small_dataset

    from pack_assets.core import store
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.records import Scanned
    from pack_assets.core.scan import run_manifest

    inp, profile = small_dataset(tmp_path / "in", n_shards=1), load_profile("qwen3-vl")

    def counted(work: Path, kept: Scanned | None) -> dict[str, list]:
        run_token_lengths(work, "part-000", profile, force=True, scanned=kept)
        d = store.token_dir(work, profile.name, "part-000")
        return {f: pq.read_table(d / f).to_pylist() for f in ("token_lengths.parquet", "rejected.parquet")}

    run_manifest(inp, tmp_path / "disk", "part-000")
    from_disk = counted(tmp_path / "disk", None)
    kept = Scanned()
    run_manifest(inp, tmp_path / "mem", "part-000", keep=kept)
    assert kept.info is not None and len(kept.samples) == 13
    assert counted(tmp_path / "mem", kept) == from_disk
    assert len(from_disk["token_lengths.parquet"]) == 12 and from_disk["rejected.parquet"] == []
    fresh = Scanned()
    run_manifest(inp, tmp_path / "mem", "part-000", force=True, keep=fresh)  # another scan: `kept` is stale now
    kept.samples.clear()  # (were it used, no sample would be counted)
    assert counted(tmp_path / "mem", kept) == from_disk
    fresh.samples.clear()  # the current scan's is used: the count is what it holds
    assert counted(tmp_path / "mem", fresh)["token_lengths.parquet"] == []


def test_a_render_sees_the_environments_globals_as_a_fresh_environment_renders_them():
    """The compiled template keeps its globals as a plain dict (no ChainMap copied per render): the same text as
    the sandbox renders without that, namespace/raise_exception/strftime_now/range included, and a template that
    raises is a template_error."""
    import dataclasses
    from datetime import datetime

    from pack_assets.core.counting import tokens

    source = ("{%- set n = namespace(k=0) %}{%- for m in messages %}{%- set n.k = n.k + 1 %}{{ n.k }}:{{ m.role }}"
              "{%- for i in range(2) %}.{{ i }}{%- endfor %}{%- endfor %} {{ strftime_now('%Y') }} {{ tools | tojson }}"
              "{%- if messages | length > 2 %}{{ raise_exception('too long') }}{%- endif %}")
    counter = TokenCounter(dataclasses.replace(load_profile("qwen3-vl"), chat_template=source))
    fresh = tokens._environment().from_string(source)
    two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    tools = [{"name": "f"}]
    want = fresh.render(messages=two, tools=tools, add_generation_prompt=False)
    assert counter.render(two, tools) == want == f'1:user.0.12:assistant.0.1 {datetime.now():%Y} [{{"name": "f"}}]'
    (bad,) = counter.count_many([(two + two[:1], [], [])])
    assert isinstance(bad, ReasonError) and bad.reason == "template_error" and "too long" in bad.detail


def test_the_sandboxs_shortcuts_render_as_transformers_sandbox_does():
    """The namespace shortcuts (a value read, namespace() called, in and out of loops) and the dict one give
    the text of the sandbox transformers renders with (its own ImmutableSandboxedEnvironment, no shortcut),
    also where they step aside: a namespace attribute that is missing, private or a method."""
    import dataclasses

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from pack_assets.core.counting import tokens

    source = ("{%- set ns = namespace(n=0, s='x', l=[1], d={'k': 2}) %}{%- for m in messages %}"
              "{%- set inner = namespace(k=loop.index) %}{%- set ns.n = ns.n + inner.k %}{{ m.content }}{{ m.nope }}"
              "{%- endfor %}|{{ ns.n }}|{{ ns.s }}|{{ ns.l }}|{{ ns.d.k }}|{{ ns.missing }}|{{ ns._private }}"
              "{%- set ns.f = ns.s.upper %}|{{ ns.f() }}|{{ ns.s.format(1) }}|{{ namespace(**{'a': 1}).a }}")
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    counter = TokenCounter(dataclasses.replace(load_profile("qwen3-vl"), chat_template=source))
    assert type(counter.template.environment) is tokens._ChatSandbox
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    want = plain.from_string(source).render(messages=messages, tools=None, add_generation_prompt=False)
    assert counter.render(messages) == want == "ab|3|x|[1]|2|||X|x|1"


def test_the_columns_of_a_scan_in_memory_are_the_rows_a_count_writes(tmp_path):
    """`count_scanned_columns` (the helpers' count of the scan they hold) gives, column by column, the rows and
    rejections `count_shard_rows` gives for the same samples, a sample whose count is refused among them."""
    from conftest import small_dataset

    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.counting.token_lengths import (
        _scanned_rows,
        count_scanned_columns,
        count_shard_rows,
    )
    from pack_assets.core.records import TOKEN_LENGTHS_SCHEMA, Scanned
    from pack_assets.core.scan import run_manifest

    inp = small_dataset(tmp_path / "in", n_shards=1)
    kept = Scanned()
    run_manifest(inp, tmp_path / "w", "part-000", keep=kept)
    real = counter_for(load_profile("qwen3-vl"))

    class Refusing:  # the real counts, every third refused as a processor would refuse it
        profile = real.profile

        def count_many(self, items):
            for i, got in enumerate(real.count_many(items)):
                yield ReasonError("placeholder_mismatch", f"stand-in {i}") if i % 3 == 1 else got

    rows, rejections = count_shard_rows(Refusing(), *_scanned_rows(kept))
    columns, column_rejections = count_scanned_columns(Refusing(), kept)
    assert {name: [r[name] for r in rows] for name in TOKEN_LENGTHS_SCHEMA.names} == columns
    assert column_rejections == rejections and len(rejections) == 4 and len(rows) == 12
