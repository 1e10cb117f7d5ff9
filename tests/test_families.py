"""Fast rules of InternVL, LLaVA-OneVision and Gemma 3 (issue 18, item 4) against oracles made once with each
model's real transformers processor (scripts/make_oracle.py; tests/fixtures/oracle/<family>.json): every
image size and every whole sample must give the processor's exact ``len(input_ids)``. No torch needed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from family_fixtures import FAMILY_DIRS

from pack_assets.core.counting.profiles import FAMILIES, profile_from_model_dir
from pack_assets.core.counting.tokens import TokenCounter
from pack_assets.core.counting.vision import media_crops, media_image_tokens
from pack_assets.core.reasons import ReasonError

ORACLE = Path(__file__).resolve().parent / "fixtures" / "oracle"


@pytest.fixture(scope="module")
def dirs(family_models) -> dict[str, Path]:
    return family_models


class _Counters(dict):
    def __init__(self, dirs):
        super().__init__()
        self.dirs = dirs

    def __missing__(self, family):  # built on first use: a deselected family costs nothing
        self[family] = TokenCounter(profile_from_model_dir(self.dirs[family]))
        return self[family]


@pytest.fixture(scope="module")
def counters(dirs) -> dict[str, TokenCounter]:
    return _Counters(dirs)


def _oracle(family: str) -> dict:
    return json.loads((ORACLE / f"{family}.json").read_text(encoding="utf-8"))


def _item(messages: list[dict], sizes: list, tools=None):
    msgs = copy.deepcopy(messages)
    if tools:
        msgs[0]["tools"] = tools  # where conversation.normalize puts a record's tools
    return msgs, sizes, []


@pytest.mark.parametrize("family", list(FAMILY_DIRS))
def test_every_image_size_counts_what_the_processor_counts(family, counters):
    oracle = _oracle(family)
    counter = counters[family]
    assert counter.profile.rule == "fast" and counter.profile.media is not None
    sizes = [(w, h, n) for w, h, n in oracle["sizes"]]
    assert len(sizes) >= 300 and {(1, 1), (1, 4000), (4000, 1), (16384, 16384)} <= {(w, h) for w, h, _ in sizes}
    results = list(counter.count_many(_item(oracle["single_image_messages"], [[w, h]]) for w, h, _ in sizes))
    wrong = [(w, h, n, r) for (w, h, n), r in zip(sizes, results)
             if isinstance(r, ReasonError) or r["total_tokens"] != n]
    assert not wrong, wrong[:10]


@pytest.mark.parametrize("family", list(FAMILY_DIRS))
def test_whole_samples_count_what_the_processor_counts(family, counters):
    oracle = _oracle(family)
    counter = counters[family]
    samples = oracle["samples"]
    assert any(len(s["image_sizes"]) > 1 for s in samples)
    assert any(s["messages"][0]["role"] == "system" for s in samples)
    results = list(counter.count_many(_item(s["messages"], s["image_sizes"], s.get("tools")) for s in samples))
    for s, r in zip(samples, results):
        assert not isinstance(r, ReasonError), (r.reason, r.detail)
        assert r["total_tokens"] == s["input_ids"], (s["image_sizes"], s["messages"])
        assert r["counted_by"] == "fast"
        assert r["total_tokens"] == r["text_tokens"] + r["image_tokens"] and r["video_tokens"] == 0
        n = len(s["image_sizes"])
        assert r["image_tokens"] == sum(media_image_tokens(w, h, n, counter.profile.media) for w, h in s["image_sizes"])


def test_rules_follow_the_folder_files(dirs, tmp_path):
    import shutil

    p = profile_from_model_dir(dirs["internvl"])
    assert (p.family, p.media.kind, p.media.tile, p.media.max_tiles, p.media.tokens) == (
        "internvl", "tiles", 448, 12, 256)
    assert p.media.prefix == "<img>" and p.media.suffix == "</img>"
    # a user who caps InternVL at 6 tiles: fewer tokens for a big image, another fingerprint
    d = tmp_path / "internvl6"
    shutil.copytree(dirs["internvl"], d)
    cfg = json.loads((d / "preprocessor_config.json").read_text())
    cfg["max_patches"] = 6
    (d / "preprocessor_config.json").write_text(json.dumps(cfg))
    p6 = profile_from_model_dir(d)
    assert media_image_tokens(4000, 3000, 1, p6.media) == 256 * 7 < media_image_tokens(4000, 3000, 1, p.media)
    assert p6.fingerprint != p.fingerprint
    # Gemma 3 with pan-and-scan on: the fast rule with the processor's crops (defaults for the nulls)
    g = _pan_and_scan_dir(dirs, tmp_path, {"do_pan_and_scan": True})
    plain, pas = profile_from_model_dir(dirs["gemma3"]), profile_from_model_dir(g)
    assert (plain.rule, plain.media.crops, pas.rule, pas.media.crops) == ("fast", (), "fast", (256, 4, 1.2))
    assert pas.fingerprint != plain.fingerprint
    assert media_image_tokens(2000, 1000, 1, pas.media) == 3 * 256  # 2 crops + the image
    assert media_image_tokens(2000, 1000, 1, plain.media) == 256
    # LLaVA-OneVision: several images in a sample get 729 + 1 each, one image the anyres count
    lo = profile_from_model_dir(dirs["llava-onevision"]).media
    assert media_image_tokens(640, 480, 2, lo) == 730 and media_image_tokens(640, 480, 1, lo) > 730


def test_videos_are_refused_where_the_model_takes_none(counters):
    """Gemma 3 takes no video; InternVL and LLaVA-OneVision count it (tests/test_family_videos.py)."""
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A ball."}]}]
    meta = {"frames": 40, "fps": 10.0, "width": 64, "height": 48}
    (res,) = counters["gemma3"].count_many([(msgs, [], [meta])])
    assert isinstance(res, ReasonError) and res.reason == "video_not_supported"
    for family in ("internvl", "llava-onevision"):
        (res,) = counters[family].count_many([(msgs, [], [meta])])
        assert not isinstance(res, ReasonError) and res["video_tokens"] > 0


def test_profiles_lists_the_fast_families():
    by = {f.name: f for f in FAMILIES}
    assert all(by[f].rule == "fast" for f in FAMILY_DIRS) and by["glm4v"].rule == "processor"


@pytest.mark.parametrize("family", list(FAMILY_DIRS))
def test_count_with_model_dir_reads_inline_media_and_gives_the_oracle(family, dirs, tmp_path):
    """`pack-assets count --model-dir`: HF-native records with inline image paths, real image files."""
    from conftest import image_bytes

    from pack_assets.core.counting.count import count_records

    oracle = _oracle(family)
    picked = [row for row in oracle["sizes"] if (row[0], row[1]) in {(896, 448), (1, 1), (4000, 2)}]
    assert len(picked) == 3
    recs = []
    for i, (w, h, _) in enumerate(picked):
        (tmp_path / f"{i}.png").write_bytes(image_bytes(w, h, "PNG"))
        msgs = copy.deepcopy(oracle["single_image_messages"])
        msgs[0]["content"][0]["image"] = str(tmp_path / f"{i}.png")
        recs.append({"messages": msgs})
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = count_records(tmp_path / "r.jsonl", None, None, str(dirs[family]))
    assert [g.get("total_tokens") for g in got] == [n for _, _, n in picked], got
    assert all(g["counted_by"] == "fast" for g in got)


def test_shard_stage_counts_a_fast_family_and_records_counted_by(dirs, tmp_path):
    import pyarrow.parquet as pq
    from conftest import image_bytes, write_tar

    from pack_assets.core.counting.token_lengths import run_token_lengths, token_lengths_are_current
    from pack_assets.core.scan import run_manifest

    oracle = _oracle("internvl")
    expected = {(w, h): n for w, h, n in oracle["sizes"]}
    members = []
    for i, (w, h) in enumerate([(896, 448), (1, 1), (4000, 2)]):
        rec = {"messages": copy.deepcopy(oracle["single_image_messages"])}
        members += [(f"k{i}.json", json.dumps(rec)), (f"k{i}.png", image_bytes(w, h, "PNG"))]
    write_tar(tmp_path / "in" / "s0.tar", members)
    work = tmp_path / "work"
    run_manifest(tmp_path / "in", work, "s0")
    profile = profile_from_model_dir(dirs["internvl"])
    run_token_lengths(work, "s0", profile)
    rows = pq.read_table(work / "token_lengths" / profile.name / "s0" / "token_lengths.parquet").to_pylist()
    assert all(r["status"] == "ok" for r in rows)
    ok = {r["sample_id"]: r for r in rows}
    assert [ok[k]["total_tokens"] for k in sorted(ok)] == [expected[(896, 448)], expected[(1, 1)], expected[(4000, 2)]]
    assert all(r["counted_by"] == "fast" for r in ok.values()) and token_lengths_are_current(work, "s0", profile)


# -- Gemma 3 pan-and-scan (tests/fixtures/oracle/gemma3_pan_and_scan.json) --------------------------------


def _pan_and_scan_dir(dirs, tmp_path: Path, values: dict) -> Path:
    """The Gemma 3 folder with preprocessor_config.json changed as a user would."""
    import hashlib
    import shutil

    d = tmp_path / f"gemma-pas-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]}"
    if not d.exists():
        shutil.copytree(dirs["gemma3"], d)
    cfg = json.loads((dirs["gemma3"] / "preprocessor_config.json").read_text())
    (d / "preprocessor_config.json").write_text(json.dumps({**cfg, **values}))
    return d


_PAS = json.loads((ORACLE / "gemma3_pan_and_scan.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pas_root(tmp_path_factory) -> Path:
    """The module's pan-and-scan folders (read-only once written): a folder's tokenizer is loaded once per path
    and process, so every test counting with the same settings reuses the first one's load."""
    return tmp_path_factory.mktemp("pas")


@pytest.fixture(scope="module")
def pas_counters(dirs, pas_root) -> dict[str, TokenCounter]:
    return {s["name"]: TokenCounter(profile_from_model_dir(_pan_and_scan_dir(dirs, pas_root, s["preprocessor_config"])))
            for s in _PAS["settings"]}


@pytest.mark.parametrize("setting", _PAS["settings"], ids=[s["name"] for s in _PAS["settings"]])
def test_pan_and_scan_every_image_size_counts_the_processors_crops_and_tokens(setting, pas_counters):
    counter = pas_counters[setting["name"]]
    media = counter.profile.media
    assert counter.profile.rule == "fast" and media.crops == tuple(
        setting["processor_kwargs"].get(k, d) for k, d in (("pan_and_scan_min_crop_size", 256),
                                                           ("pan_and_scan_max_num_crops", 4),
                                                           ("pan_and_scan_min_ratio_to_activate", 1.2)))
    rows = setting["sizes"]
    sizes = {(w, h) for w, h, *_ in rows}
    # the boundaries are there: activation ratio, min crop size, crop cap, both orientations
    assert {(1200, 1000), (1199, 1000), (1000, 1200), (384, 256), (383, 256), (256, 384), (512, 600), (511, 600),
            (12000, 300), (300, 12000)} <= sizes
    assert len({c for *_, c in rows}) >= 3  # no crops, and several crop counts
    if setting["name"] == "defaults":
        assert len(rows) >= 300 and {(1, 1), (1, 4000), (4000, 1), (16384, 16384)} <= sizes
        assert {0, 2, 3, 4} <= {c for *_, c in rows}
    wrong_crops = [(w, h, c, media_crops(w, h, media)) for w, h, _, c in rows if media_crops(w, h, media) != c]
    assert not wrong_crops, wrong_crops[:10]
    # the oracle itself: a size and its 90°-rotated self get the same crops (EXIF orientation cannot matter)
    by = {(w, h): c for w, h, _, c in rows}
    assert all(by[(h, w)] == c for (w, h), c in by.items() if (h, w) in by)
    results = list(counter.count_many(_item(_PAS["single_image_messages"], [[w, h]]) for w, h, *_ in rows))
    wrong = [(w, h, n, r) for (w, h, n, _), r in zip(rows, results)
             if isinstance(r, ReasonError) or r["total_tokens"] != n]
    assert not wrong, wrong[:10]
    for (_, _, _, c), r in zip(rows, results):
        assert r["image_tokens"] == 256 * (1 + c) and r["counted_by"] == "fast"


def test_pan_and_scan_whole_samples_count_what_the_processor_counts(pas_counters):
    (setting,) = [s for s in _PAS["settings"] if s["samples"]]
    counter = pas_counters[setting["name"]]
    samples = setting["samples"]
    cropped = [s for s in samples if any(media_crops(w, h, counter.profile.media) for w, h in s["image_sizes"])]
    assert len(cropped) >= 10 and any(len(s["image_sizes"]) > 1 for s in cropped)
    assert any(s.get("tools") for s in samples) and any(s["messages"][0]["role"] == "system" for s in cropped)
    results = list(counter.count_many(_item(s["messages"], s["image_sizes"], s.get("tools")) for s in samples))
    for s, r in zip(samples, results):
        assert not isinstance(r, ReasonError), (r.reason, r.detail)
        assert r["total_tokens"] == s["input_ids"], (s["image_sizes"], s["messages"])
        assert r["total_tokens"] == r["text_tokens"] + r["image_tokens"] and r["counted_by"] == "fast"


def test_pan_and_scan_bad_settings_and_sizes_get_a_reason(dirs, tmp_path, pas_root):
    from pack_assets.core.counting.profiles import ProfileError

    for values, match in (({"do_pan_and_scan": "yes"}, "do_pan_and_scan"),
                          ({"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 0}, "pan_and_scan_min_crop_size"),
                          ({"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 2.5}, "pan_and_scan_max_num_crops"),
                          ({"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": "1.2"}, "min_ratio")):
        with pytest.raises(ProfileError, match=match):
            profile_from_model_dir(_pan_and_scan_dir(dirs, tmp_path, values))
    # off (false or null) is the plain fixed rule
    assert profile_from_model_dir(_pan_and_scan_dir(dirs, tmp_path, {"do_pan_and_scan": False})).media.crops == ()
    counter = TokenCounter(profile_from_model_dir(_pan_and_scan_dir(dirs, pas_root, {"do_pan_and_scan": True})))
    (res,) = counter.count_many([_item(_PAS["single_image_messages"], [[0, 500]])])
    assert isinstance(res, ReasonError) and res.reason == "bad_image"


def test_pan_and_scan_count_with_model_dir_reads_image_headers_and_gives_the_oracle(dirs, tmp_path, pas_root):
    """`pack-assets count --model-dir` on the pan-and-scan folder: real image files of sizes with 0, 2, 3 and 4
    crops, their sizes read from the headers."""
    from conftest import image_bytes

    from pack_assets.core.counting.count import count_records

    (setting,) = [s for s in _PAS["settings"] if s["name"] == "defaults"]
    picked = {}
    for w, h, n, c in setting["sizes"]:
        if max(w, h) <= 2000 and c not in picked:
            picked[c] = (w, h, n)
    assert sorted(picked) == [0, 2, 3, 4]
    recs = []
    for i, (w, h, _) in enumerate(picked.values()):
        (tmp_path / f"{i}.png").write_bytes(image_bytes(w, h, "PNG"))
        msgs = copy.deepcopy(_PAS["single_image_messages"])
        msgs[0]["content"][0]["image"] = str(tmp_path / f"{i}.png")
        recs.append({"messages": msgs})
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    folder = _pan_and_scan_dir(dirs, pas_root, setting["preprocessor_config"])
    got = count_records(tmp_path / "r.jsonl", None, None, str(folder))
    assert [g.get("total_tokens") for g in got] == [n for _, _, n in picked.values()], got
    assert all(g["counted_by"] == "fast" for g in got)
