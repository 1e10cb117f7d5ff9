"""docs/training.md's examples run as they are written: the PyTorch DataLoader with PackCollator and the
Megatron-Energon task encoder on a small packed output (Qwen3-VL; the image processor from the copied
config in tests/fixtures), and the InternVL / LLaVA-OneVision / Gemma 3 one on an InternVL output."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import needs, small_dataset
from pack_helpers import MODELS, pack_shards

from pack_assets.reader import PackEncoder

DOC = Path(__file__).resolve().parents[1] / "docs" / "training.md"
needs_torch = needs(importlib.util.find_spec("torch") is None, "torch is not installed (extra `train`)")
needs_energon = needs(importlib.util.find_spec("megatron") is None
                      or importlib.util.find_spec("megatron.energon") is None,
                      "megatron-energon not installed (extra `energon`)")


def _example(section: str) -> str:
    """The first python block after the heading ``section``."""
    text = DOC.read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text[text.index(f"## {section}"):], re.S).group(1)


@pytest.fixture(scope="module")
def packed_here(tmp_path_factory):
    """A folder holding ``packed/`` (text, one- and two-image samples) and the checkpoint folder the
    examples name (the copied config files)."""
    root = tmp_path_factory.mktemp("docs")
    packs = pack_shards(small_dataset(root / "in"), root, "qwen3-vl", max_len=1500, out=root / "packed")
    (root / "Qwen3-VL-8B-Instruct").symlink_to(MODELS / "Qwen3-VL-8B-Instruct")
    return root, packs


def _check(batch: dict, packs: list[dict]) -> None:
    enc = PackEncoder("qwen3-vl")
    by_len = {len(enc.encode(p)["input_ids"]) for p in packs}
    B, L = batch["input_ids"].shape
    assert B in (1, 2) and L in by_len and batch["position_ids"].shape == (4, B, L)
    assert batch["rope_position_ids"].shape == (3, B, L) and int(batch["cu_seqlens"][-1]) == B * L
    assert batch["max_seqlen"] == int(np.diff(batch["cu_seqlens"].numpy()).max())


@needs_torch
def test_the_dataloader_example_runs(packed_here, monkeypatch):
    root, packs = packed_here
    monkeypatch.chdir(root)
    ns: dict = {}
    exec(compile(_example("In a PyTorch DataLoader"), "training.md", "exec"), ns)
    _check(ns["batch"], packs)
    assert ns["batch"]["pixel_values"].shape[0] == int(ns["batch"]["image_grid_thw"].prod(-1).sum())


@needs_torch
@needs_energon
def test_the_energon_example_runs(packed_here, monkeypatch):
    root, packs = packed_here
    monkeypatch.chdir(root)
    ns: dict = {}
    exec(compile(_example("With Megatron-Energon"), "training.md", "exec"), ns)
    assert ns["step"] == 2
    _check(ns["batch"], packs)


class _RealIds:
    """The user's model as the example calls it (real token ids) around a tiny one with a renumbered vocabulary."""

    def __init__(self, model, vocab):
        self.model, self.vocab, self.config = model, vocab, model.config

    def __call__(self, input_ids, **kw):
        import torch

        with torch.no_grad():
            return self.model(input_ids=self.vocab(input_ids), use_cache=False, **kw)


@needs_torch
def test_the_family_example_runs(family_models, tmp_path, monkeypatch):
    """The InternVL / LLaVA-OneVision / Gemma 3 example on an InternVL packed folder (the fixture's config
    folder as the checkpoint, a tiny random model standing in for the user's)."""
    from conftest import write_tar
    from pack_helpers import family_samples
    from tiny_models import tiny_family_model

    from pack_assets.core.counting.profiles import profile_from_model_dir

    folder = family_models["internvl"]
    write_tar(tmp_path / "in" / "f.tar", family_samples())
    packs = pack_shards(
        tmp_path / "in", tmp_path, profile_from_model_dir(folder), max_len=1600, out=tmp_path / "packed"
    )
    (tmp_path / "InternVL3-2B-hf").symlink_to(folder)
    first = [PackEncoder(model_dir=str(folder)).encode(p)["input_ids"] for p in packs[:2]]
    ids = np.concatenate(first + [np.array([151643])])
    monkeypatch.chdir(tmp_path)
    ns: dict = {"model": _RealIds(*tiny_family_model(folder, ids))}
    exec(compile(_example("InternVL, LLaVA-OneVision, Gemma 3"), "training.md", "exec"), ns)
    B, L = ns["batch"]["input_ids"].shape
    assert ns["logits"].shape[:2] == (B, L) == (2, max(len(e) for e in first)) and ns["mask"] is None
    assert ns["vision"]["pixel_values"].shape[1:] == (3, 448, 448) and bool(ns["logits"].isfinite().all())
