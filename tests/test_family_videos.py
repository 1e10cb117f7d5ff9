"""Video fast rules of InternVL and LLaVA-OneVision (issue 18) against the oracles made once with each model's
real transformers processor decoding real video files (scripts/make_oracle.py;
tests/fixtures/oracle/<family>.videos.json): whole samples with videos, under each video processor setting
the oracle was made with (every frame, num_frames, fps). No torch needed: the rule reads container metadata."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from family_fixtures import VIDEO_CONFIGS, VIDEOS, video_variant

from pack_assets.core.counting.profiles import ProfileError, profile_from_model_dir
from pack_assets.core.counting.tokens import TokenCounter
from pack_assets.core.counting.vision import sampled_frames
from pack_assets.core.reasons import ReasonError

ORACLE = Path(__file__).resolve().parent / "fixtures" / "oracle"
FAMILIES = ("internvl", "llava-onevision")
CASES = [(f, c) for f in FAMILIES for c in VIDEO_CONFIGS[f]]
# the processor's refusal (oracle "error: ...") -> the reason the fast rule must give instead
REFUSALS = {"exceeds": "video_sampling", "ZeroDivisionError": "video_sampling", "mutually exclusive": "video_sampling",
            "stack expects": "video_frames_differ"}


@pytest.fixture(scope="module")
def dirs(family_models) -> dict[str, Path]:
    return {f: family_models[f] for f in FAMILIES}


def _oracle(family: str) -> dict:
    return json.loads((ORACLE / f"{family}.videos.json").read_text(encoding="utf-8"))


def _items(oracle: dict, samples: list[dict]):
    for s in samples:
        msgs = copy.deepcopy(s["messages"])
        if s.get("tools"):
            msgs[0]["tools"] = s["tools"]  # where conversation.normalize puts a record's tools
        yield msgs, s["image_sizes"], [oracle["videos"][n]["probe"] for n in s["videos"]]


def _fps_source_differs(oracle: dict, config: dict | None, names: list[str]) -> bool:
    """True where fps sampling keeps another frame count with torchcodec's measured fps (the processor's
    loader) than with the header's rate (the rule's, and transformers' PyAV loader's): the one known gap."""
    if not config or config.get("fps") is None or config.get("num_frames") is not None:
        return False
    for n in names:
        v = oracle["videos"][n]
        t = v["probe"]["frames"]
        if int(t / v["probe"]["fps"] * config["fps"]) != int(t / v["torchcodec"]["average_fps"] * config["fps"]):
            return True
    return False


@pytest.mark.parametrize(("family", "config"), CASES)
def test_video_samples_count_what_the_processor_counts(family, config, dirs):
    oracle = _oracle(family)
    cfg = oracle["configs"][config]
    assert cfg["video_preprocessor_config"] == VIDEO_CONFIGS[family][config]
    counter = TokenCounter(profile_from_model_dir(video_variant(dirs[family], family, config)))
    assert counter.profile.rule == "fast"
    samples = cfg["samples"]
    gaps = []
    for s, r in zip(samples, counter.count_many(_items(oracle, samples)), strict=True):
        expected = s["input_ids"]
        if isinstance(expected, str):  # the processor refused: the rule gives the matching reason
            want = next(reason for key, reason in REFUSALS.items() if key in expected)
            assert isinstance(r, ReasonError) and r.reason == want, (s["videos"], expected, r)
            continue
        assert not isinstance(r, ReasonError), (s["videos"], r.reason, r.detail)
        if _fps_source_differs(oracle, cfg["video_preprocessor_config"], s["videos"]):
            gaps.append(s["videos"])
            assert r["total_tokens"] != expected
            continue
        assert r["total_tokens"] == expected, (s["videos"], s["messages"])
        assert r["counted_by"] == "fast" and r["video_tokens"] > 0
        assert r["total_tokens"] == r["text_tokens"] + r["image_tokens"] + r["video_tokens"]
    # the gap shows only where the two fps differ enough to change int(T / fps * target): one clip, fps 10
    assert gaps == ([["lf_1.mp4"]] if config == "fps_10" else [])


def test_oracle_covers_whole_samples_and_every_clip():
    for family in FAMILIES:
        oracle = _oracle(family)
        samples = oracle["configs"]["default"]["samples"]
        assert {n for s in samples for n in s["videos"]} == set(oracle["videos"])
        assert any(s["image_sizes"] and s["videos"] for s in samples)  # an image and a video in one sample
        assert any(len(s["videos"]) > 1 for s in samples) and any(s.get("tools") for s in samples)
        assert any(s["messages"][0]["role"] == "system" for s in samples)
        assert sum(isinstance(s["input_ids"], int) for s in samples) >= 14
        # every frame by default: the frame counts the processor's decoder saw are the container's
        assert all(v["probe"]["frames"] == v["torchcodec"]["num_frames"] for v in oracle["videos"].values())


def test_committed_clips_are_the_oracle_clips():
    """The clips a test reads are the oracle's: the product's probe reads the same metadata from them."""
    from pack_assets.core.media import probe_video

    oracle = _oracle("internvl")
    committed = {n for n, v in oracle["videos"].items() if v["committed"]}
    assert committed == {p.name for p in VIDEOS.iterdir()}
    assert sum(p.stat().st_size for p in VIDEOS.iterdir()) < 150_000
    for name in committed:
        with open(VIDEOS / name, "rb") as f:
            assert probe_video(f) == oracle["videos"][name]["probe"], name


@pytest.mark.parametrize("family", FAMILIES)
def test_shard_with_videos_counts_the_oracle_and_a_broken_video_is_a_reason_row(family, dirs, tmp_path):
    import pyarrow.parquet as pq
    from conftest import write_tar

    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.scan import run_manifest

    oracle = _oracle(family)
    single = {s["videos"][0]: s for s in oracle["configs"]["default"]["samples"] if len(s["messages"]) == 2
              and len(s["videos"]) == 1 and s["messages"][0]["content"][1].get("text") == "What happens?"}
    names = ["g12_64x48_30fps.mp4", "g7_32x320_10fps.webm", "lf_4.mp4", "g40_80x60_ntsc.mov"]
    members = []
    for i, name in enumerate(names):
        members += [(f"k{i}.json", json.dumps({"messages": single[name]["messages"]})),
                    (f"k{i}{Path(name).suffix}", (VIDEOS / name).read_bytes())]
    broken = (VIDEOS / names[0]).read_bytes()[:300]  # cut inside the container: no readable stream
    members += [("kbad.json", json.dumps({"messages": single[names[0]]["messages"]})), ("kbad.mp4", broken)]
    write_tar(tmp_path / "in" / "s0.tar", members)
    work = tmp_path / "work"
    run_manifest(tmp_path / "in", work, "s0")
    profile = profile_from_model_dir(dirs[family])
    counts = run_token_lengths(work, "s0", profile)
    assert counts.counted == len(names)
    rows = pq.read_table(work / "token_lengths" / profile.name / "s0" / "token_lengths.parquet").to_pylist()
    got = {r["sample_id"].split("/")[-1]: r for r in rows}
    assert [got[f"k{i}"]["total_tokens"] for i in range(len(names))] == [single[n]["input_ids"] for n in names]
    assert all(got[f"k{i}"]["media_type"] == "video" for i in range(len(names)))
    rejected = pq.read_table(work / "manifest" / "s0" / "rejected.parquet").to_pylist()
    assert [(r["key"], r["reason"]) for r in rejected] == [("kbad", "bad_video")]


def test_unreadable_metadata_and_refusals_are_reasons_not_crashes(dirs):
    counter = TokenCounter(profile_from_model_dir(dirs["internvl"]))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A ball."}]}]
    metas = [{"fps": 10.0}, {"frames": "many", "fps": 10.0}, {"frames": 0, "fps": 10.0},
             {"frames": 1_000_001, "fps": 30.0}, None]
    res = list(counter.count_many([(msgs, [], [m]) for m in metas] + [(msgs, [], [])]))
    assert [r.reason for r in res] == ["bad_video"] * 5 + ["placeholder_mismatch"], res
    # every frame needs no rate; sampling by fps does
    (ok,) = counter.count_many([(msgs, [], [{"frames": 4, "fps": None}])])
    assert ok["video_tokens"] > 4 * 258
    by_fps = TokenCounter(profile_from_model_dir(video_variant(dirs["internvl"], "internvl", "fps_10")))
    (res,) = by_fps.count_many([(msgs, [], [{"frames": 40, "fps": None}])])
    assert res.reason == "bad_video"


def test_gemma3_takes_no_video(family_models):
    counter = TokenCounter(profile_from_model_dir(family_models["gemma3"]))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A ball."}]}]
    (res,) = counter.count_many([(msgs, [], [{"frames": 40, "fps": 10.0, "width": 64, "height": 48}])])
    assert isinstance(res, ReasonError) and res.reason == "video_not_supported"


def test_sampling_follows_the_folder_video_config(dirs, tmp_path):
    """The video processor's config as transformers finds it: processor_config.json's nested
    video_processor, else video_preprocessor_config.json, else preprocessor_config.json (class defaults)."""
    import shutil

    meta = {"frames": 100, "fps": 25.0, "width": 64, "height": 48}
    base = profile_from_model_dir(dirs["internvl"])
    assert base.video.sampler == "all-frames" and sampled_frames(meta, base.video) == 100
    d = tmp_path / "ivl"
    shutil.copytree(dirs["internvl"], d)
    (d / "video_preprocessor_config.json").write_text(json.dumps({"do_sample_frames": True, "num_frames": 16}))
    p16 = profile_from_model_dir(d)
    assert (p16.video.sampler, p16.video.num_frames, p16.video.initial_shift) == ("internvl", 16, None)
    assert sampled_frames(meta, p16.video) == 16 and p16.fingerprint != base.fingerprint
    proc = json.loads((d / "processor_config.json").read_text())
    proc["video_processor"] = {"do_sample_frames": True, "fps": 1, "initial_shift": 0}
    (d / "processor_config.json").write_text(json.dumps(proc))
    p1 = profile_from_model_dir(d)
    assert (p1.video.sample_fps, p1.video.initial_shift) == (1.0, 0.0) and sampled_frames(meta, p1.video) == 4
    # a null is the class default (transformers reads it so): initial_shift true, as when the key is absent
    proc["video_processor"] = {"do_sample_frames": True, "num_frames": 16, "initial_shift": None}
    (d / "processor_config.json").write_text(json.dumps(proc))
    assert profile_from_model_dir(d).video == p16.video
    proc["video_processor"] = {"do_sample_frames": True, "num_frames": "sixteen"}
    (d / "processor_config.json").write_text(json.dumps(proc))
    with pytest.raises(ProfileError, match="num_frames 'sixteen'"):
        profile_from_model_dir(d)
    # InternVL's arange(shift, T, T / n): n frames for a half-step shift, T / (T / n) rounding kept
    for total, n in ((100, 16), (7, 3), (1000, 999), (491, 327)):
        assert sampled_frames({"frames": total, "fps": 1.0}, p16.video.__class__(
            "internvl", 0, 0, 0, 0.0, 0, 0, 0, 0, num_frames=n)) == n
    lo = profile_from_model_dir(dirs["llava-onevision"])
    assert lo.video.sampler == "all-frames" and (lo.media.video, lo.media.frame_tokens) == ("<video>", 196)


@pytest.mark.parametrize("family", FAMILIES)
def test_count_with_model_dir_reads_inline_videos_and_gives_the_oracle(family, dirs, tmp_path):
    """`pack-assets count --model-dir`: HF-native records naming the committed clips inline."""
    from pack_assets.core.counting.count import count_records

    oracle = _oracle(family)
    samples = [s for s in oracle["configs"]["default"]["samples"]
               if isinstance(s["input_ids"], int) and all(oracle["videos"][n]["committed"] for n in s["videos"])]
    assert len(samples) >= 8
    recs = []
    for s in samples:
        msgs, vids = copy.deepcopy(s["messages"]), iter(s["videos"])
        for m in msgs:
            for part in m["content"]:
                if part["type"] == "video":
                    part["video"] = str(VIDEOS / next(vids))
        rec = {"messages": msgs, **({"tools": s["tools"]} if s.get("tools") else {})}
        if s["image_sizes"]:
            from conftest import image_bytes

            names = []
            for i, (w, h) in enumerate(s["image_sizes"]):
                (tmp_path / f"{len(recs)}_{i}.png").write_bytes(image_bytes(w, h, "PNG"))
                names.append(str(tmp_path / f"{len(recs)}_{i}.png"))
            imgs = iter(names)
            for m in msgs:
                for part in m["content"]:
                    if part["type"] == "image":
                        part["image"] = next(imgs)
        recs.append(rec)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = count_records(tmp_path / "r.jsonl", None, None, str(dirs[family]))
    assert [g.get("total_tokens") for g in got] == [s["input_ids"] for s in samples], got
