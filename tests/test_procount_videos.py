"""Videos through the processor rule (issue 18, item 3): a video is counted by the folder's own video processor
on blank zero-stride stand-in frames with the manifest's metadata (frames, fps, size, duration), its
replacement string cached per metadata. Oracle: the same processor called on the committed clips' real frames,
decoded with PyAV into numpy, with their true metadata. Also against the fast rules where one exists.

Needs torch + torchvision (the `processor` extra; CI installs it and then these tests fail rather than skip)."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import image_bytes, needs, write_tar
from family_fixtures import VIDEO_CONFIGS, VIDEOS, video_variant
from family_fixtures import processor as _plain_processor

from pack_assets.core.counting.counters import counter_for
from pack_assets.core.counting.profiles import load_profile, processor_profile, profile_from_model_dir
from pack_assets.core.counting.tokenizers import tokenizer_for
from pack_assets.core.media import probe_video
from pack_assets.core.reasons import ReasonError

_MISSING = importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None
pytestmark = needs(_MISSING, "torch + torchvision are not installed (pip install 'pack_assets[processor]')")

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
CLIPS = ["g12_64x48_30fps.mp4", "g50_200x120_25fps.mp4", "g7_32x320_10fps.webm", "g1_96x64_24fps.mp4",
         "g40_80x60_ntsc.mov", "lf_4.mp4"]
_VP = {"qwen2.5-vl": "Qwen2VLVideoProcessor", "qwen3-vl": "Qwen3VLVideoProcessor"}
# video processor settings per family: None = the folder as it is; else keys written into a copy's
# video_preprocessor_config.json (on top of the folder's own video/preprocessor config)
CONFIGS = {
    "qwen2.5-vl": {"default": None, "fps_2": {"do_sample_frames": True, "fps": 2},
                   "num_frames_8": {"do_sample_frames": True, "num_frames": 8}},
    "qwen3-vl": {"default": None, "fps_10": {"fps": 10}, "num_frames_8": {"fps": None, "num_frames": 8}},
    **VIDEO_CONFIGS,
}
CASES = [(f, c) for f in CONFIGS for c in CONFIGS[f]]
G1, G7, G12 = ["g1_96x64_24fps.mp4"], ["g7_32x320_10fps.webm"], ["g12_64x48_30fps.mp4"]
PAIR = ["lf_4.mp4", "g40_80x60_ntsc.mov"]  # 150 and 40 frames
# the samples each processor refuses on the real frames (a 1-frame clip, fewer frames than asked, InternVL
# stacking two videos of different lengths, ...): the processor rule gives processor_error with its message
REFUSED = {("qwen2.5-vl", "fps_2"): [G1], ("qwen2.5-vl", "num_frames_8"): [G7, G1], ("qwen3-vl", "default"): [G1],
           ("qwen3-vl", "fps_10"): [G1], ("internvl", "default"): [PAIR], ("internvl", "num_frames_8"): [G7, G1],
           ("internvl", "fps_10"): [G1, PAIR], ("internvl", "fps_2_no_shift"): [G12, G1, G12 * 2, PAIR],
           ("llava-onevision", "num_frames_8"): [G7, G1],
           ("llava-onevision", "fps_and_num_frames"): "all"}  # "mutually exclusive": the sampler takes one
# (a gap once listed here: InternVL's fps sampling keeping one frame failed on numpy frames, which
# transformers indexes with a 1-element torch index as a scalar; frames as torch tensors, as torchcodec
# decodes a file and as the stand-ins are, count it as the fast rule does)


@functools.cache
def _clip(name: str) -> tuple[np.ndarray, dict]:
    """Real frames (PyAV, rgb24) and the metadata the manifest stores for the clip."""
    import av

    with av.open(str(VIDEOS / name)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    with open(VIDEOS / name, "rb") as f:
        meta = probe_video(f)
    return frames, meta


def _qwen_folder(root: Path, family: str) -> Path:
    d = root / family
    if not d.exists():
        src = {"qwen2.5-vl": "Qwen2.5-VL-7B-Instruct", "qwen3-vl": "Qwen3-VL-8B-Instruct"}[family]
        shutil.copytree(MODELS / src, d)
        tokenizer_for(load_profile(family)).save(str(d / "tokenizer.json"))  # the model's own added tokens
    return d


def _variant(root: Path, families: dict[str, Path], family: str, config: str) -> Path:
    if family not in _VP:
        return video_variant(families[family], family, config)
    base = _qwen_folder(root, family)
    cfg = CONFIGS[family][config]
    if cfg is None:
        return base
    d = root / f"{family}.{config}"
    if not d.exists():
        shutil.copytree(base, d)
        own = d / "video_preprocessor_config.json"
        data = json.loads((own if own.exists() else d / "preprocessor_config.json").read_text())
        data.pop("image_processor_type", None)
        own.write_text(json.dumps({**data, "video_processor_type": _VP[family], **cfg}, indent=2))
    return d


@pytest.fixture(scope="module")
def variant(tmp_path_factory, family_models):
    """(family, config) -> the folder of that video config (the Qwen ones built here, the others beside the
    session's family folders)."""
    root = tmp_path_factory.mktemp("procvideo")
    return lambda family, config: _variant(root, family_models, family, config)


def _t(s: str) -> dict:
    return {"type": "text", "text": s}


VID, IMG = {"type": "video"}, {"type": "image"}


def _samples() -> list[tuple[list[dict], list, list[str]]]:
    """(messages, image sizes, clip names): one clip alone each, system + multi-turn, image + video, two videos
    (same frame count, and different: InternVL's processor refuses those)."""
    out = [([{"role": "user", "content": [VID, _t("What happens?")]}, {"role": "assistant", "content": "A gradient."}],
            [], [c]) for c in CLIPS]
    out.append(([{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [VID, _t("Describe the motion.")]},
                 {"role": "assistant", "content": [_t("It moves left.")]},
                 {"role": "user", "content": [_t("And the colours?\n\n")]},
                 {"role": "assistant", "content": "Blue to red.\n"}], [], ["lf_4.mp4"]))
    out.append(([{"role": "user", "content": [IMG, VID, _t("Same scene?")]}, {"role": "assistant", "content": "No."}],
                [(300, 200)], ["g50_200x120_25fps.mp4"]))
    out.append(([{"role": "user", "content": [VID, _t("First.")]}, {"role": "assistant", "content": "Ok."},
                 {"role": "user", "content": [VID, _t("Second; which is longer?")]},
                 {"role": "assistant", "content": "Equal."}], [], ["g12_64x48_30fps.mp4", "g12_64x48_30fps.mp4"]))
    out.append(([{"role": "user", "content": [VID, VID, _t("Compare.")]},
                 {"role": "assistant", "content": "Different."}], [], ["lf_4.mp4", "g40_80x60_ntsc.mov"]))
    return out


def _oracle(proc, msgs: list[dict], sizes: list, clips: list[str]):
    """len(input_ids) of the processor on the real decoded frames with their true metadata, or its error. The
    frames go in as torchcodec hands them to the processor when it decodes a file: a (frames, 3, H, W) uint8
    tensor."""
    import torch
    from PIL import Image
    from transformers.video_utils import VideoMetadata

    text = proc.apply_chat_template(msgs, tokenize=False)
    images = [Image.open(__import__("io").BytesIO(image_bytes(w, h, "PNG"))).convert("RGB") for w, h in sizes]
    videos, metas = [], []
    for name in clips:
        frames, meta = _clip(name)
        assert len(frames) == meta["frames"], name  # the container's count is the decoded count
        videos.append(torch.from_numpy(frames).permute(0, 3, 1, 2))
        metas.append(VideoMetadata(total_num_frames=len(frames), fps=meta["fps"], width=meta["width"],
                                   height=meta["height"], duration=meta["duration"], video_backend="pyav"))
    try:
        out = proc(text=[text], images=[images] if images else None, videos=videos or None,
                   video_metadata=metas or None, add_special_tokens=False)
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"
    return len(out["input_ids"][0])


@pytest.mark.parametrize(("family", "config"), CASES)
def test_video_samples_equal_the_processor_on_real_frames(family, config, variant):
    folder = variant(family, config)
    counter = counter_for(processor_profile(folder))
    assert counter.profile.rule == "processor"
    proc = _plain_processor(folder)
    samples = _samples()
    items = [(m, [list(s) for s in sz], [_clip(c)[1] for c in clips]) for m, sz, clips in samples]
    first = list(counter.count_many(copy.deepcopy(items)))
    again = list(counter.count_many(copy.deepcopy(items)))  # every metadata seen: the direct path
    pc = counter
    expected = REFUSED.get((family, config), [])
    assert pc.fallbacks == 0 and (pc.direct_counts > 0 or expected == "all")
    refused = []
    for (msgs, sizes, clips), a, b in zip(samples, first, again, strict=True):
        want = _oracle(proc, msgs, sizes, clips)
        if isinstance(want, str):  # the processor refuses: a processor_error row with its message
            refused.append((clips, want[:90]))
            assert isinstance(a, ReasonError) and a.reason == "processor_error", (clips, want, a)
            assert isinstance(b, ReasonError) and b.reason == "processor_error"
            assert a.detail.split(":")[0] in want, (a.detail, want)
            continue
        assert not isinstance(a, ReasonError), (clips, a.reason, a.detail)
        assert a == b and a["total_tokens"] == want, (family, config, clips, a, want)
        assert a["video_tokens"] > 0 and a["counted_by"] == "processor"
        assert a["total_tokens"] == a["text_tokens"] + a["image_tokens"] + a["video_tokens"]
    assert [c for c, _ in refused] == ([c for _, _, c in samples] if expected == "all" else expected)


# no fast rule to compare with: Qwen2.5-VL's fast rule samples as qwen-vl-utils does (fps 2, an even count,
# per-frame pixel caps: a documented profile setting), not as the folder's video processor; a Qwen3-VL folder
# with num_frames is counted by its processor (the fast rule samples by fps only)
FAST_CASES = [(f, c) for f, c in CASES if f != "qwen2.5-vl" and (f, c) != ("qwen3-vl", "num_frames_8")]


def test_a_qwen3_folder_sampling_by_num_frames_takes_the_processor_rule(variant):
    assert profile_from_model_dir(variant("qwen3-vl", "num_frames_8")).rule == "processor"
    assert profile_from_model_dir(variant("qwen3-vl", "fps_10")).rule == "fast"


@pytest.mark.parametrize(("family", "config"), FAST_CASES)
def test_video_samples_equal_the_fast_rule(family, config, variant):
    folder = variant(family, config)
    fast_profile = profile_from_model_dir(folder)
    assert fast_profile.rule == "fast"
    fast, proc_rule = counter_for(fast_profile), counter_for(processor_profile(folder))
    samples = _samples()
    items = [(m, [list(s) for s in sz], [_clip(c)[1] for c in clips]) for m, sz, clips in samples]
    got, want = list(proc_rule.count_many(copy.deepcopy(items))), list(fast.count_many(copy.deepcopy(items)))
    for (_, _, clips), g, w in zip(samples, got, want, strict=True):
        if isinstance(w, ReasonError):  # the fast rule names the refusal more precisely (video_frames_differ)
            assert isinstance(g, ReasonError), (clips, w.reason, g)
            continue
        assert not isinstance(g, ReasonError), (clips, g.reason, g.detail)
        assert (g["total_tokens"], g["video_tokens"]) == (w["total_tokens"], w["video_tokens"]), (
            family, config, clips, g, w)


def test_a_broken_video_and_a_refused_video_are_reason_rows(variant, tmp_path):
    """Through the shard stage: a truncated clip is `bad_video` in the manifest (as for the fast rules); a
    video the processor refuses (more frames asked than it has) is `processor_error` with its message; bad
    metadata is `bad_video` before any processor call."""
    import pyarrow.parquet as pq

    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.scan import run_manifest

    folder = variant("llava-onevision", "num_frames_8")
    msgs = [{"role": "user", "content": [VID, _t("What happens?")]},
            {"role": "assistant", "content": [_t("A gradient.")]}]
    members = []
    for key, clip in (("k0", "lf_4.mp4"), ("k1", "g7_32x320_10fps.webm")):  # 150 frames; 7 < 8 asked
        members += [(f"{key}.json", json.dumps({"messages": msgs})),
                    (f"{key}{Path(clip).suffix}", (VIDEOS / clip).read_bytes())]
    members += [("kbad.json", json.dumps({"messages": msgs})), ("kbad.mp4", (VIDEOS / "lf_4.mp4").read_bytes()[:300])]
    write_tar(tmp_path / "in" / "s0.tar", members)
    work = tmp_path / "work"
    run_manifest(tmp_path / "in", work, "s0")
    profile = processor_profile(folder)
    run_token_lengths(work, "s0", profile)
    rows = {r["sample_id"].split("/")[-1]: r for r in
            pq.read_table(work / "token_lengths" / profile.name / "s0" / "token_lengths.parquet").to_pylist()}
    assert rows["k0"]["status"] == "ok" and rows["k0"]["counted_by"] == "processor"
    assert rows["k0"]["total_tokens"] == _oracle(_plain_processor(folder), msgs, [], ["lf_4.mp4"])
    assert (rows["k1"]["status"], rows["k1"]["reason"]) == ("rejected", "processor_error")
    want = _oracle(_plain_processor(folder), msgs, [], ["g7_32x320_10fps.webm"])
    (res,) = counter_for(profile).count_many([(msgs, [], [_clip("g7_32x320_10fps.webm")[1]])])
    assert want.startswith("error: ValueError") and res.reason == "processor_error" and res.detail in want
    manifest_rejected = pq.read_table(work / "manifest" / "s0" / "rejected.parquet").to_pylist()
    assert [(r["key"], r["reason"]) for r in manifest_rejected] == [("kbad", "bad_video")]
    counter = counter_for(profile)
    metas = [{"fps": 10.0, "width": 64, "height": 48}, {"frames": 0, "fps": 10.0, "width": 64, "height": 48},
             {"frames": 10, "fps": 10.0, "width": 0, "height": 48}, {"frames": 10, "fps": 10.0}, None]
    res = list(counter.count_many([(msgs, [], [m]) for m in metas]))
    assert [getattr(r, "reason", r) for r in res] == ["bad_video"] * 5


def test_video_status_says_how_videos_are_counted(variant):
    from pack_assets.core.counting.procount import ProcessorCounter

    status = ProcessorCounter(processor_profile(variant("qwen3-vl", "default"))).video_status()
    assert status.startswith("counted by Qwen3VLVideoProcessor") and "cached per video metadata" in status


def test_qwen3_timestamps_follow_the_fps_in_the_cache_key(variant):
    """Two videos with the same frames and size but another frame rate: Qwen3-VL samples and timestamps them
    differently; the cache keeps them apart (each equals a fresh counter's whole call)."""
    from pack_assets.core.counting.procount import ProcessorCounter

    folder = variant("qwen3-vl", "default")
    counter = ProcessorCounter(processor_profile(folder))
    msgs = [{"role": "user", "content": [VID, _t("When?")]}, {"role": "assistant", "content": "Now."}]
    a = {"frames": 120, "fps": 30.0, "width": 64, "height": 48, "duration": 4.0}
    b = {**a, "fps": 10.0, "duration": 12.0}
    runs = list(counter.count_many([(msgs, [], [a]), (msgs, [], [b])] * 3))
    assert runs[0]["total_tokens"] != runs[1]["total_tokens"]
    assert [r["total_tokens"] for r in runs] == [counter.count(msgs, [], [m])["total_tokens"] for m in (a, b)] * 3
    assert counter.fallbacks == 0 and counter.direct_counts >= 4


def test_a_video_too_big_for_the_memory_budget_is_a_reason_row_before_any_processor_call(variant, monkeypatch):
    """The stand-in frames are virtual, but a video processor materializes the frames it keeps and its output
    for each: a sample whose videos (one processor call) would pass the budget is video_memory_budget with the
    figures, before the processor runs on them; sampling that keeps fewer frames brings it under; the videos
    of one sample add up; an upsampling processor's output counts, not only the input size."""
    from pack_assets.core.counting import procount

    monkeypatch.setenv(procount.BUDGET_ENV, "0.5")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what happens?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a thing"}]}]

    def count(family, config, frames, n_videos=1, size=(1920, 1080)):
        pc = procount.ProcessorCounter(processor_profile(variant(family, config)))  # a fresh cache
        m = copy.deepcopy(msgs)
        m[0]["content"] = [{"type": "video"}] * n_videos + m[0]["content"][1:]
        meta = {"frames": frames, "fps": 30.0, "width": size[0], "height": size[1], "duration": frames / 30}
        return list(pc.count_many([(m, [], [meta] * n_videos)]))[0], pc

    # InternVL keeps every frame: an hour of 1080p (~670 GB of frames) is refused at once
    got, pc = count("internvl", "default", 108_000)
    assert isinstance(got, ReasonError) and got.reason == "video_memory_budget" and "108000 frames" in got.detail
    assert "GiB" in got.detail and procount.BUDGET_ENV in got.detail
    assert pc._video_reps == {}  # no replacement was computed: the processor never ran on the video
    # Qwen2.5-VL sampling 2 fps keeps 120 of 1,800 frames: over 0.5 GiB; 300 frames keep 20 (~0.27 GB), under it
    got, _ = count("qwen2.5-vl", "fps_2", 1800)
    assert isinstance(got, ReasonError) and got.reason == "video_memory_budget" and "120 frames" in got.detail
    got, _ = count("qwen2.5-vl", "fps_2", 300)
    assert not isinstance(got, ReasonError) and got["video_tokens"] > 0
    # ... but four such videos in one sample go to one processor call: together over the budget
    got, _ = count("qwen2.5-vl", "fps_2", 300, n_videos=4)
    assert isinstance(got, ReasonError) and got.reason == "video_memory_budget" and got.detail.count("20 frames") == 4
    # LLaVA-OneVision upsamples each 64x48 frame to 384x384 and keeps every frame: its output decides
    got, _ = count("llava-onevision", "default", 3000, size=(64, 48))
    assert isinstance(got, ReasonError) and got.reason == "video_memory_budget"


@pytest.mark.parametrize("value", ["abc", "0", "-2", "inf"])
def test_a_bad_video_budget_is_a_clear_error_when_the_counter_is_built(variant, monkeypatch, value):
    from pack_assets.core.counting import procount

    monkeypatch.setenv(procount.BUDGET_ENV, value)
    with pytest.raises(ValueError, match=procount.BUDGET_ENV):
        procount.ProcessorCounter(processor_profile(variant("qwen2.5-vl", "fps_2")))


def test_a_full_video_cache_evicts_the_least_recently_used_and_never_turns_the_self_check_off(variant, monkeypatch):
    """With room for 3 video replacements: A, B, X, then [B, A], then [B, A, C] (A and B used again, so X is the
    one evicted; C's first sight then evicts again). Every count equals the whole processor call and the
    direct path stays on (a FIFO eviction once dropped a replacement a checked sample still needed: KeyError,
    self-check failed, whole calls for the rest of the run)."""
    from pack_assets.core.counting import procount

    monkeypatch.setattr(procount, "_CACHE_MAX", 3)
    pc = procount.ProcessorCounter(processor_profile(variant("qwen2.5-vl", "default")))
    a, b, x, c = (_clip(n)[1] for n in ["lf_4.mp4", "g40_80x60_ntsc.mov", "g50_200x120_25fps.mp4",
                                         "g12_64x48_30fps.mp4"])

    def sample(*metas):
        return ([{"role": "user", "content": [{"type": "video"}] * len(metas) + [{"type": "text", "text": "and?"}]},
                 {"role": "assistant", "content": [{"type": "text", "text": "so."}]}], [], list(metas))

    items = [sample(a), sample(b), sample(x), sample(b, a), sample(b, a), sample(b, a, c), sample(b, a, c), sample(x)]
    got = list(pc.count_many(copy.deepcopy(items)))
    want = [pc.count(*copy.deepcopy(i)) for i in items]
    assert got == want and pc.fallbacks == 0 and pc._direct and pc._direct_video
    assert len(pc._video_reps) <= 3
