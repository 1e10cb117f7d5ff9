"""The processor rule (issue 18, item 3) and `pack-assets profiles` (item 6): a --model-dir family with no
fast rule is counted by its own transformers processor. Oracle: the same processor's
``apply_chat_template(..., tokenize=True, return_dict=True)`` with the real images attached. Gemma 3 files:
tests/fixtures/models/gemma-3-4b-it (see tests/fixtures/README.md; the tokenizer is stored compressed)."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import lzma
import shutil
from pathlib import Path

import pytest
from conftest import image_bytes, write_tar

from pack_assets.cli import main
from pack_assets.core.counting.count import count_records
from pack_assets.core.counting.profiles import FAMILIES, load_profile, profile_from_model_dir

GEMMA = Path(__file__).resolve().parent / "fixtures" / "models" / "gemma-3-4b-it"
SIZES = [(300, 200), (640, 480), (37, 1000), (1920, 1080), (896, 896)]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemma-3-4b-it")
    for f in GEMMA.iterdir():
        if f.suffix == ".xz":
            (d / f.stem).write_bytes(lzma.decompress(f.read_bytes()))
        elif f.suffix == ".gz":
            (d / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
        else:
            shutil.copy(f, d / f.name)
    # pan-and-scan on in the file: the processor's default call ignores it in transformers 5.23 (no crops),
    # the fast rule counts its crops (tests/test_families.py); this module keeps Gemma 3 on the processor rule
    cfg = json.loads((d / "preprocessor_config.json").read_text())
    cfg["do_pan_and_scan"] = True
    (d / "preprocessor_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(autouse=True)
def _gemma3_on_the_processor_rule(monkeypatch):
    """Gemma 3 has a fast rule for every setting of its files now; these tests are about the processor rule,
    so a Gemma 3 folder is routed as a family without one."""
    from pack_assets.core.counting import profiles

    monkeypatch.delitem(profiles._DIR_FAMILIES, "gemma3")


def _records(img: Path) -> list[dict]:
    part = lambda i: {"type": "image", "image": str(img / f"{i}.png")}  # noqa: E731
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    return [
        {"messages": [{"role": "system", "content": [t("Be brief.")]},
                      {"role": "user", "content": [part(0), t("What is it?")]},
                      {"role": "assistant", "content": [t("A red square.")]},
                      {"role": "user", "content": [part(1), part(2), t("\n\nAnd these two?")]},
                      {"role": "assistant", "content": [t("Also squares.\n\n")]}]},
        {"messages": [{"role": "user", "content": [t("No image, just text:  spaces\n\n\n")]},
                      {"role": "assistant", "content": [t("ok")]}]},
        {"messages": [{"role": "user", "content": [part(3), part(4), part(0)]},
                      {"role": "assistant", "content": [t("Three.")]}]},
        {"conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "A box."}],
         "images": [str(img / "4.png")]},
    ]


def _oracle(proc, rec: dict) -> int:
    """len(input_ids) of the processor's chat path with the real images (its own image processor)."""
    from PIL import Image

    from pack_assets.core.conversation import media_refs, normalize, place_media

    refs = media_refs(rec).images
    msgs = place_media(normalize(rec), len(refs), 0)
    images = [Image.open(r).convert("RGB") for r in refs]
    oracle = copy.copy(proc)
    oracle.image_processor = proc.image_processor._inner  # no memo: the real pixels go through
    text = oracle.apply_chat_template(msgs, tokenize=False)
    out = oracle(text=[text], images=[images] if images else None, add_special_tokens=False)
    return len(out["input_ids"][0])


def test_gemma3_counts_equal_its_processor_on_whole_samples(gemma_dir, tmp_path):
    from pack_assets.core.counting.procount import load_processor

    p = profile_from_model_dir(gemma_dir)
    assert (p.rule, p.family) == ("processor", "gemma3")
    img = tmp_path / "img"
    img.mkdir()
    for i, (w, h) in enumerate(SIZES):
        (img / f"{i}.png").write_bytes(image_bytes(w, h, "PNG", (i * 40, 90, 200)))
    recs = _records(img)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = count_records(tmp_path / "r.jsonl", None, None, str(gemma_dir))
    proc = load_processor(p.model_dir)
    for rec, res in zip(recs, got):
        assert res.get("counted_by") == "processor", res
        assert res["total_tokens"] == _oracle(proc, rec)
    # <image_soft_token>s; the wrappers count as text. (Gemma3Processor's own call default, do_pan_and_scan
    # False, wins over the config's in transformers 5.23: no crops here, and the oracle agrees.)
    assert got[2]["image_tokens"] == 3 * 256
    # chat-path oracle too: apply_chat_template(tokenize=True) itself, one <bos>
    ids = proc.apply_chat_template(recs[1]["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert got[1]["total_tokens"] == len(ids[0] if isinstance(ids[0], list) else ids)


def test_processor_rule_in_the_shard_stage_records_counted_by(gemma_dir, tmp_path):
    import pyarrow.parquet as pq

    from pack_assets.core.counting.token_lengths import run_token_lengths, token_lengths_are_current
    from pack_assets.core.scan import run_manifest

    rec = {"conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A box."}]}
    members = []
    for i in range(3):
        members += [(f"k{i}.json", json.dumps(rec)), (f"k{i}.jpg", image_bytes(64 + i, 48))]
    write_tar(tmp_path / "in" / "s0.tar", members)
    work = tmp_path / "work"
    run_manifest(tmp_path / "in", work, "s0")
    for profile, rule in ((profile_from_model_dir(gemma_dir), "processor"), (load_profile("qwen3-vl"), "fast")):
        run_token_lengths(work, "s0", profile)
        rows = pq.read_table(work / "token_lengths" / profile.name / "s0" / "token_lengths.parquet").to_pylist()
        assert [r["counted_by"] for r in rows] == [rule] * 3 and all(r["status"] == "ok" for r in rows)
        assert token_lengths_are_current(work, "s0", profile)
    stamp = work / "token_lengths" / "qwen3-vl" / "s0" / "stamp.json"
    old = json.loads(stamp.read_text())
    old.pop("format")  # a stamp written before counted_by existed: recounted, never mixed into a view
    stamp.write_text(json.dumps(old))
    assert not token_lengths_are_current(work, "s0", load_profile("qwen3-vl"))


def test_a_folder_without_processor_files_says_what_it_needs(tmp_path):
    from pack_assets.core.counting.profiles import ProfileError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl"}))
    with pytest.raises(ProfileError, match="preprocessor_config.json"):
        profile_from_model_dir(tmp_path)


def test_profiles_command_lists_every_family(capsys):
    assert main(["profiles", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["families"]
    assert [f["family"] for f in out] == [f.name for f in FAMILIES]
    by = {f["family"]: f for f in out}
    assert by["qwen3-vl"]["rule"] == "fast" and "video_preprocessor_config.json" in by["qwen3-vl"]["model_dir_files"]
    assert {"gemma3", "internvl", "llava-onevision", "glm4v", "any"} <= set(by)
    assert main(["profiles"]) == 0 and "processor" in capsys.readouterr().out


# -- the direct path (per-size replacement strings, one batched tokenizer call) against the whole processor ---

def _fresh_caches(monkeypatch):
    """Processors and counters are cached per worker; a test that patches what they are built from starts
    and leaves with empty caches."""
    from pack_assets.core.counting import environment, procount

    for name in ("load_processor", "processor_counter"):
        monkeypatch.setattr(procount, name, functools.lru_cache(maxsize=2)(getattr(procount, name).__wrapped__))
    for name in ("build_processor", "processor_settings"):  # the build the fingerprint shares with the counter
        monkeypatch.setattr(environment, name, functools.lru_cache(maxsize=8)(getattr(environment, name).__wrapped__))


def _pan_and_scan(proc):
    """Gemma 3's processor with pan-and-scan on: the replacement string then depends on the image size."""
    out = copy.copy(proc)
    out.image_processor = proc.image_processor._inner
    merge = proc._merge_kwargs

    def merged(*a, **k):  # as a training script's processor(..., do_pan_and_scan=True) would set it
        kwargs = merge(*a, **k)
        kwargs["images_kwargs"]["do_pan_and_scan"] = True
        return kwargs
    out._merge_kwargs = merged
    return out


def test_counts_from_the_size_cache_equal_the_processor_on_real_images_over_many_sizes(gemma_dir, monkeypatch):
    """Pixels never decide a count: for 37 sizes (1×1, extreme aspect ratios, small to large, with crops) the
    counter's direct path (size-cached replacement strings) equals the processor run on real noise images."""
    import random

    import numpy as np
    from PIL import Image

    from pack_assets.core.counting import processors, procount
    from pack_assets.core.counting.counters import counter_for

    real = procount.load_processor(str(gemma_dir.resolve()))
    oracle = _pan_and_scan(real)
    counted = copy.copy(oracle)
    counted.image_processor = processors._CachedImageProcessor(oracle.image_processor)
    _fresh_caches(monkeypatch)
    monkeypatch.setattr(procount, "load_processor", lambda *a: counted)
    rnd = random.Random(7)
    sizes = [(1, 1), (1, 2000), (2000, 1), (3, 700), (1500, 40), (896, 896), (897, 895), (256, 1024), (1024, 256)]
    sizes += [(rnd.randint(2, 1200), rnd.randint(2, 1200)) for _ in range(28)]
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    samples = [([{"role": "system", "content": [t("Be brief.")]},
                 {"role": "user", "content": [{"type": "image"}, t(f"Sample {i}:\n\n")]},
                 {"role": "assistant", "content": [t("Noise.")]},
                 {"role": "user", "content": [t("And"), *([{"type": "image"}] if i % 4 == 0 else [])]},
                 {"role": "assistant", "content": [t(" also noise \n")]}],
                [list(sizes[i]), list(sizes[(i * 7 + 3) % len(sizes)])][:1 + (i % 4 == 0)], [])
               for i in range(len(sizes))]
    counter = counter_for(profile_from_model_dir(gemma_dir))
    first = list(counter.count_many(samples))
    again = list(counter.count_many(samples))  # every size seen: all through the direct path
    assert counter.fallbacks == 0 and counter.direct_counts >= len(samples)
    crops = set()
    for (msgs, szs, _), a, b in zip(samples, first, again):
        images = [Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))
                  for w, h in szs]
        text = oracle.apply_chat_template(msgs, tokenize=False)
        ids = oracle(text=[text], images=[images], add_special_tokens=False)["input_ids"][0]
        assert a == b and a["total_tokens"] == len(ids), (szs, a, len(ids))
        crops.add(a["image_tokens"] // 256)
    assert len(crops) >= 3  # the sizes really exercise different crop counts


def test_gemma3_whole_samples_through_the_direct_path_equal_the_processor(gemma_dir, tmp_path):
    """Multi-turn, system, several images: counted twice, the second time every size is cached (direct path)."""
    from pack_assets.core.counting.procount import load_processor

    img = tmp_path / "img"
    img.mkdir()
    for i, (w, h) in enumerate(SIZES):
        (img / f"{i}.png").write_bytes(image_bytes(w, h, "PNG", (i * 40, 90, 200)))
    recs = _records(img) * 2
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = count_records(tmp_path / "r.jsonl", None, None, str(gemma_dir))
    proc = load_processor(str(gemma_dir.resolve()))
    for rec, res in zip(recs, got):
        assert res["total_tokens"] == _oracle(proc, rec), res


# -- remote code, missing packages -------------------------------------------------------------------------

def _remote_code_folder(tmp_path: Path) -> Path:
    d = tmp_path / "remote"
    d.mkdir()
    for name in ("preprocessor_config.json", "processor_config.json", "special_tokens_map.json"):
        shutil.copy(GEMMA / name, d / name)
    cfg = json.loads((GEMMA / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "my_vlm",
                                               "auto_map": {"AutoProcessor": "processing_my_vlm.MyProcessor"}}))
    (d / "tokenizer_config.json").write_text("{}")
    return d


def test_a_remote_code_folder_is_refused_without_trust_remote_code(tmp_path, capsys):
    from pack_assets.core.counting.profiles import ProfileError
    from pack_assets.core.settings import Settings

    d = _remote_code_folder(tmp_path)
    with pytest.raises(ProfileError, match=r"auto_map in config.json.*--trust-remote-code"):
        profile_from_model_dir(d)
    with pytest.raises(ProfileError, match="--trust-remote-code"):
        Settings(model_dir=str(d)).model_profile()
    p = Settings(model_dir=str(d), trust_remote_code=True).model_profile()
    assert (p.rule, p.trust_remote_code) == ("processor", True)
    (tmp_path / "r.jsonl").write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    assert main(["count", "--input", str(tmp_path / "r.jsonl"), "--model-dir", str(d)]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err


def _qwen3_folder(tmp_path: Path) -> Path:
    from pack_assets.core.counting.profiles import bundled_tokenizer_file

    d = tmp_path / "qwen3"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "models" / "Qwen3-VL-8B-Instruct", d)
    shutil.copy(bundled_tokenizer_file(), d / "tokenizer.json")
    return d


def _no_torchvision(monkeypatch):
    """AutoProcessor fails the way transformers does when a video processor needs torchvision."""
    import transformers

    def refuse(*a, **k):
        raise ImportError("Qwen3VLVideoProcessor requires the Torchvision library but it was not found in your "
                          "environment.")
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", refuse)
    _fresh_caches(monkeypatch)


def test_without_torchvision_images_count_and_videos_get_reason_rows(tmp_path, monkeypatch):
    """The processor rule on Qwen3-VL (a folder the fast rule covers too): its video processor 'needs
    torchvision', so the processor is built without it; image samples equal the fast rule, video samples are
    rejected with missing_dependency naming the package and the extra."""
    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.counting.profiles import processor_profile
    from pack_assets.core.counting.token_lengths import count_shard_rows

    d = _qwen3_folder(tmp_path)
    _no_torchvision(monkeypatch)
    proc_counter, fast = counter_for(processor_profile(d)), counter_for(profile_from_model_dir(d))
    assert (proc_counter.profile.rule, fast.profile.rule) == ("processor", "fast")
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    img_msgs = [{"role": "system", "content": "Short answers."},
                {"role": "user", "content": [{"type": "image"}, t("What?")]},
                {"role": "assistant", "content": "A chart."},
                {"role": "user", "content": [{"type": "image"}, {"type": "image"}, t("These?")]},
                {"role": "assistant", "content": [t("Two cats.")]}]
    vid_msgs = [{"role": "user", "content": [{"type": "video"}, t("What happens?")]},
                {"role": "assistant", "content": "Nothing."}]
    items = [(img_msgs, [[640, 480], [37, 1000], [1920, 1080]], []), (img_msgs, [[640, 480]] * 3, [])] * 2
    got, want = list(proc_counter.count_many(items)), list(fast.count_many(items))
    assert [g["total_tokens"] for g in got] == [w["total_tokens"] for w in want]
    assert [g["image_tokens"] for g in got] == [w["image_tokens"] for w in want]
    assert proc_counter.direct_counts >= 2 and proc_counter.fallbacks == 0  # repeated sizes: direct
    meta = {"frames": 48, "fps": 24.0, "width": 320, "height": 240}
    rows = [{"sample_id": f"s{i}", "shard": "s0", "key": f"k{i}", "status": "ok", "media_type": m,
             "n_images": len(sz), "n_videos": len(v), "conversation": json.dumps(msgs), "image_sizes": sz,
             "videos": json.dumps(v)}
            for i, (m, msgs, sz, v) in enumerate([("image", img_msgs, [[64, 48]] * 3, []),
                                                  ("video", vid_msgs, [], [meta])])]
    out, rejected = count_shard_rows(proc_counter, rows, {})
    assert [r["status"] for r in out] == ["ok", "rejected"]
    assert out[1]["reason"] == "missing_dependency" and out[1]["counted_by"] == "processor"
    assert "torchvision" in rejected[0].detail and "pack_assets[processor]" in rejected[0].detail


def test_a_processor_that_cannot_be_built_names_the_missing_package_and_the_extra(gemma_dir, monkeypatch):
    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.counting.profiles import ProfileError

    _no_torchvision(monkeypatch)  # Gemma 3's processor has no video part to leave out: nothing to count with
    with pytest.raises(ProfileError, match=r"needs torchvision.*pip install 'pack_assets\[processor\]'"):
        counter_for(profile_from_model_dir(gemma_dir))


def test_a_processor_whose_image_part_needs_torchvision_is_refused_with_the_extra(gemma_dir, monkeypatch):
    """InternVL's way: transformers raises a ValueError 'requires `torchvision` to be installed'."""
    import transformers

    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.counting.profiles import ProfileError

    def refuse(*a, **k):
        raise ValueError(f"{gemma_dir} requires `torchvision` to be installed. Please install `torchvision`.")
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", refuse)
    _fresh_caches(monkeypatch)
    with pytest.raises(ProfileError, match=r"needs torchvision.*pack_assets\[processor\]") as e:
        counter_for(profile_from_model_dir(gemma_dir))
    assert "trust-remote-code" not in str(e.value)


def test_profiles_for_one_folder_builds_its_processor(gemma_dir, capsys):
    assert main(["profiles", "--model-dir", str(gemma_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["rule"], out["family"], out["processor"]) == ("processor", "gemma3", "Gemma3Processor")
    assert out["videos"].startswith("none")


def test_a_processor_that_expands_its_own_way_falls_back_to_the_whole_call(gemma_dir, monkeypatch):
    """The self-check: a processor whose __call__ does more than the standard hooks (here: it appends text)
    makes the direct path differ on the first new size; from then on every sample takes the whole call."""
    from pack_assets.core.counting import procount
    from pack_assets.core.counting.counters import counter_for

    real = procount.load_processor(str(gemma_dir.resolve()))

    class OwnWay(type(real)):
        def __call__(self, images=None, text=None, **kwargs):
            return super().__call__(images=images, text=[t + " Extra words." for t in text], **kwargs)

    odd = copy.copy(real)
    odd.__class__ = OwnWay
    _fresh_caches(monkeypatch)
    monkeypatch.setattr(procount, "load_processor", lambda *a: odd)
    counter = counter_for(profile_from_model_dir(gemma_dir))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A box."}]}]
    got = list(counter.count_many([(msgs, [[640, 480]], [])] * 5))
    assert counter.fallbacks == 1 and counter.direct_counts == 0
    assert [g["total_tokens"] for g in got] == [counter.count(msgs, [[640, 480]], [])["total_tokens"]] * 5


def test_run_refuses_before_any_shard_run_when_the_processor_cannot_be_built(gemma_dir, tmp_path, monkeypatch,
                                                                               capsys):
    _no_torchvision(monkeypatch)  # Gemma 3 has no video part to leave out: its processor cannot be built
    rec = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
    write_tar(tmp_path / "in" / "s0.tar", [("k0.json", json.dumps(rec))])
    code = main(["run", "--input", str(tmp_path / "in"), "--max-len", "512", "--work", str(tmp_path / "work"),
                 "--output", str(tmp_path / "out"), "--dagster-home", str(tmp_path / "dh"),
                 "--model-dir", str(gemma_dir), "--jobs", "1"])
    assert code == 2 and "pip install 'pack_assets[processor]'" in capsys.readouterr().err
    assert not (tmp_path / "work" / "manifest").exists() and not (tmp_path / "out").exists()


def test_an_image_size_checked_alone_is_checked_again_in_a_multi_image_sample(family_models):
    """LLaVA-OneVision expands one image by anyres but each of several by 729 + 1: the direct path's check
    of a size in a one-image sample does not vouch for that size among several (it over-counted ~4x)."""
    from pack_assets.core.counting.procount import ProcessorCounter
    from pack_assets.core.counting.profiles import processor_profile

    counter = ProcessorCounter(processor_profile(family_models["llava-onevision"]))
    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
           {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "hi"}]},
           {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    size = (640, 480)
    batched = [r["total_tokens"] for r in counter.count_many([(one, [size], []), (two, [size, size], [])])]
    assert batched == [counter.count(one, [size], [])["total_tokens"],
                       counter.count(two, [size, size], [])["total_tokens"]]
    assert batched[1] < batched[0]  # several images: 729 + 1 each, less than one anyres image
