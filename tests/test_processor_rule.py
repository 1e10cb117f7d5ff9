"""The processor rule (issue 18, item 3) and `pack-assets profiles` (item 6): a --model-dir family with no
fast rule is counted by its own transformers processor. Oracle: the same processor's
``apply_chat_template(..., tokenize=True, return_dict=True)`` with the real images attached. Gemma 3 files:
tests/fixtures/models/gemma-3-4b-it (see tests/fixtures/README.md; the tokenizer is stored compressed)."""

from __future__ import annotations

import copy
import gzip
import json
import lzma
import shutil
from pathlib import Path

import pytest

from conftest import image_bytes, write_tar
from pack_assets.cli import main
from pack_assets.core.ingest import count_records
from pack_assets.core.profiles import FAMILIES, load_profile, profile_from_model_dir

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
    # pan-and-scan on: the Gemma 3 setting its fast rule leaves to the processor (tests/test_families.py has
    # the fast rule of the default files)
    cfg = json.loads((d / "preprocessor_config.json").read_text())
    cfg["do_pan_and_scan"] = True
    (d / "preprocessor_config.json").write_text(json.dumps(cfg))
    return d


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
    from pack_assets.core.procount import load_processor

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

    from pack_assets.core.scan import run_manifest
    from pack_assets.core.tokens import run_token_lengths, token_lengths_are_current

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
    from pack_assets.core.profiles import ProfileError

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
