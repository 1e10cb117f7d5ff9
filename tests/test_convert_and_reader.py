"""Ingest real demo datasets (tests/fixtures/datasets) into shards, pack them, and read the packs back as a
trainer would: lengths equal the planner's, labels only on assistant turns, cu_seqlens and positions."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pack_assets.cli import main
from pack_assets.core import store
from pack_assets.core.audit import run_audit
from pack_assets.core.convert import convert
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import run_write
from pack_assets.reader import PackEncoder, iter_encoded, iter_packs

# copies of ../shared/fixtures (tests/fixtures/README.md)
DATA = Path(__file__).resolve().parent / "fixtures" / "datasets"


def _inputs(tmp: Path) -> tuple[list[Path], list[Path]]:
    # LLaMA-Factory's v1 file names media under "data/": give it that layout with a link
    (tmp / "lf").mkdir()
    (tmp / "lf" / "data").symlink_to(DATA / "llama-factory")
    (tmp / "q").mkdir()  # and Qwen's finetune demo names them under "demo/"
    (tmp / "q" / "demo").symlink_to(DATA / "qwen3-vl-finetune-demo")
    inputs = [DATA / "llama-factory" / "mllm_demo.json", DATA / "llama-factory" / "mllm_video_demo.json",
              DATA / "llama-factory" / "mllm_audio_demo.json", DATA / "llama-factory" / "v1_multimodal_demo.jsonl",
              DATA / "lmms-finetune" / "single_image.json", DATA / "lmms-finetune" / "multi_images.json",
              DATA / "lmms-finetune" / "video.json", DATA / "lmms-finetune" / "single_image_has_text_only.json",
              DATA / "oumi" / "vision_language_oumi_format.jsonl",
              DATA / "qwen3-vl-finetune-demo" / "single_images.json", DATA / "qwen3-vl-finetune-demo" / "video.json"]
    roots = [DATA / "llama-factory", tmp / "lf", DATA / "lmms-finetune" / "images", DATA / "lmms-finetune" / "videos",
             tmp / "q", DATA / "qwen3-vl-finetune-demo" / "videos"]
    return inputs, roots


def test_convert_real_demo_datasets_with_reasons_for_what_cannot_be_packed(tmp_path):
    inputs, roots = _inputs(tmp_path)
    res = convert(inputs, tmp_path / "shards", roots, samples_per_shard=10)
    assert res["records"] == res["converted"] + res["rejected"]
    # audio, a video not in the demo, URLs
    assert res["reasons"] == {"unsupported_media": 3, "missing_media": 1, "remote_media": 2}
    rejected = [json.loads(line) for line in Path(res["rejected_file"]).read_text().splitlines()]
    assert {r["reason"] for r in rejected} == set(res["reasons"]) and all(r["detail"] for r in rejected)
    assert len(res["shards"]) == -(-res["converted"] // 10)
    again = convert(inputs, tmp_path / "again", roots, samples_per_shard=10)
    for a, b in zip(res["shards"], again["shards"]):
        assert Path(a).read_bytes() == Path(b).read_bytes()  # deterministic
    with tarfile.open(res["shards"][0]) as tf:
        names = tf.getnames()
        first = json.loads(tf.extractfile(names[0]).read())
    assert names[:3] == ["000000000.json", "000000000.img0.jpg", "000000000.img1.jpg"]
    assert first["images"] == ["img0.jpg", "img1.jpg"] and first["origin"]["file"] == "mllm_demo.json"


@pytest.mark.parametrize("profile", ["qwen2.5-vl", "qwen3-vl"])
def test_round_trip_convert_pack_read_lengths_equal_the_plan(tmp_path, profile):
    inputs, roots = _inputs(tmp_path)
    shards = tmp_path / "shards"
    convert(inputs, shards, roots, samples_per_shard=8)
    work, out = tmp_path / "work", tmp_path / "out"
    prof = load_profile(profile)
    keys = list(store.find_shards(shards))
    for k in keys:
        run_manifest(shards, work, k)
        run_token_lengths(work, k, prof)
    plan = run_plan(work, keys, PlanConfig(max_len=32768), prof)
    run_write(work, shards, out, workers=1)
    assert run_audit(work, out).ok
    with store.connect(work, read_only=True) as con:
        counts = dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths WHERE status='ok'").fetchall())
        media_types = {r[0] for r in
                       con.execute("SELECT DISTINCT media_type FROM samples WHERE status='ok'").fetchall()}
    assert media_types == {"text", "image", "video"}
    n = 0
    for enc in iter_encoded(sorted(out.glob("*.tar")), profile):
        cu = enc["cu_seqlens"]
        assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == len(enc["input_ids"]) == len(enc["labels"])
        for sid, a, b in zip(enc["sample_ids"], cu[:-1], cu[1:]):
            assert b - a == counts[sid]
            assert (enc["position_ids"][a:b] == np.arange(b - a)).all()
            assert enc["labels"][a] == -100
        n += len(enc["sample_ids"])
    assert n == plan.samples - plan.dropped


def test_labels_cover_assistant_turns_only_and_weights(tmp_path, dataset):
    work, out = tmp_path / "work", tmp_path / "out"
    prof = load_profile("qwen3-vl")
    keys = list(store.find_shards(dataset))
    for k in keys:
        run_manifest(dataset, work, k)
        run_token_lengths(work, k, prof)
    run_plan(work, keys, PlanConfig(max_len=1500), prof)
    run_write(work, dataset, out, workers=1)
    pack = next(iter_packs(sorted(out.glob("*.tar"))))
    enc = PackEncoder("qwen3-vl")
    res = enc.encode(pack)
    tok = enc.tok
    cu = res["cu_seqlens"]
    for i, s in enumerate(pack["samples"]):
        labels = res["labels"][cu[i]:cu[i + 1]]
        trained = tok.decode([int(t) for t in labels if t != -100], skip_special_tokens=False)
        answers = [p["text"] for m in s["messages"] if m["role"] == "assistant"
                   for p in m["content"] if p["type"] == "text"]
        assert trained == "".join(a + "<|im_end|>" for a in answers)
    for mode in ("sample", "sqrt"):
        w = PackEncoder("qwen3-vl", loss_weighting=mode).encode(pack)["loss_weights"]
        for a, b in zip(cu[:-1], cu[1:]):
            n = int((res["labels"][a:b] != -100).sum())
            expected = 1.0 if mode == "sample" else np.sqrt(n)
            assert np.isclose(w[a:b].sum(), expected, rtol=1e-4)
    tampered = dict(pack, _meta=dict(pack["_meta"],
                                     sample_token_lens=[n + 1 for n in pack["_meta"]["sample_token_lens"]]))
    with pytest.raises(ValueError, match="differ"):
        enc.encode(tampered)


def test_convert_cli(tmp_path, capsys):
    args = ["convert", "--input", str(DATA / "lmms-finetune" / "single_image.json"), "--media-root",
            str(DATA / "lmms-finetune" / "images"), "--output", str(tmp_path / "s"), "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["converted"] == 2 and res["rejected"] == 0
