"""Rotated images for every family (issue 36, item 4), against tests/fixtures/oracle/rotated.json: the real
processors (scripts/make_oracle.py --rotated) on images whose EXIF or XMP orientation is 1-8, loaded as
transformers' load_image loads them. The fast rule of each family and the processor rule count them equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import needs
from exif_images import oriented_image
from family_fixtures import qwen_folder

try:
    import torchvision  # noqa: F401  (InternVL's, LLaVA-OneVision's and Qwen's processors need it)
    NO_TORCHVISION = False
except ImportError:
    NO_TORCHVISION = True
processor_needed = needs(NO_TORCHVISION, "torchvision is not installed (the processor extra)")
ORACLE = json.loads((Path(__file__).resolve().parent / "fixtures" / "oracle" / "rotated.json").read_text())
FAMILIES = sorted(ORACLE["families"])


@pytest.fixture(scope="module")
def folder_of(tmp_path_factory, family_models):
    """family -> its checkpoint folder (the Qwen ones built here, the others the session's)."""
    models = tmp_path_factory.mktemp("rotated-models")
    return lambda family: qwen_folder(models, family) if family.startswith("qwen") else family_models[family]


def _records(tmp: Path, family: str) -> tuple[Path, list[int]]:
    """One JSONL record per oracle case, its image written next to it; the expected counts."""
    one, lines, want = ORACLE["single_image_messages"], [], []
    for i, c in enumerate(ORACLE["families"][family]["cases"]):
        ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[c["format"]]
        (tmp / f"{i}.{ext}").write_bytes(oriented_image(c["format"], c["orientation"], *c["stored"], how=c["how"]))
        msgs = [{**m, "content": [{**p, "image": f"{i}.{ext}"} if p["type"] == "image" else p for p in m["content"]]}
                for m in one]
        lines.append(json.dumps({"messages": msgs}))
        want.append(c["input_ids"])
    (tmp / "r.jsonl").write_text("\n".join(lines) + "\n")
    return tmp / "r.jsonl", want


def test_the_oracle_turns_images_where_it_matters():
    """The oracle is not trivially orientation-free: LLaVA-OneVision's count of an 800x300 photo changes at 5-8."""
    cases = ORACLE["families"]["llava-onevision"]["cases"]
    by = {c["orientation"]: c["input_ids"] for c in cases if c["stored"] == [800, 300] and c["format"] == "JPEG"}
    assert by[1] == by[2] == by[3] == by[4] != by[5] == by[6] == by[7] == by[8]
    assert set(FAMILIES) == {"gemma3", "internvl", "llava-onevision", "qwen2.5-vl", "qwen3-vl"}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_fast_rule_counts_rotated_images_as_the_processor_does(family, folder_of, tmp_path):
    from pack_assets.core.counting.count import count_records
    from pack_assets.core.counting.profiles import profile_from_model_dir

    path, want = _records(tmp_path, family)
    fast = profile_from_model_dir(folder_of(family))
    assert fast.rule == "fast"
    assert [r.get("total_tokens", r.get("error")) for r in count_records(path, None, fast)] == want


@processor_needed
@pytest.mark.parametrize("family", FAMILIES)
def test_the_processor_rule_counts_rotated_images_as_the_processor_does(family, folder_of, tmp_path):
    from pack_assets.core.counting.count import count_records
    from pack_assets.core.counting.profiles import processor_profile

    path, want = _records(tmp_path, family)
    got = count_records(path, None, processor_profile(folder_of(family)))
    assert [r.get("total_tokens", r.get("error")) for r in got] == want
