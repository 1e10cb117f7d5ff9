"""The checkpoint folders of the fast-rule families, built from tests/fixtures/models (big files stored
compressed; see tests/fixtures/README.md). Shared by tests/test_families.py and scripts/make_oracle.py, so the
oracle and the tests read the same files."""

from __future__ import annotations

import functools
import gzip
import json
import lzma
import shutil
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
FAMILY_DIRS = {"internvl": "InternVL3-2B-hf.RECONSTRUCTED",
               "llava-onevision": "llava-onevision-qwen2-7b-ov-hf.RECONSTRUCTED", "gemma3": "gemma-3-4b-it"}
_QWEN2_BPE = ("internvl", "llava-onevision")  # vocab.json + merges.txt stored once in qwen2-bpe/
VIDEOS = Path(__file__).resolve().parent / "fixtures" / "videos"
_VIDEO_PROCESSOR = {"internvl": "InternVLVideoProcessor", "llava-onevision": "LlavaOnevisionVideoProcessor"}
# the video processor settings the video oracles were made with: name -> the video_preprocessor_config.json
# written into a copy of the folder (None: the folder as the conversion script leaves it, no such file)
VIDEO_CONFIGS = {
    "internvl": {"default": None,
                 "num_frames_8": {"do_sample_frames": True, "num_frames": 8},
                 "fps_10": {"do_sample_frames": True, "fps": 10},
                 "fps_2_no_shift": {"do_sample_frames": True, "fps": 2, "initial_shift": False}},
    "llava-onevision": {"default": None,
                        "num_frames_8": {"do_sample_frames": True, "num_frames": 8},
                        "fps_10": {"do_sample_frames": True, "fps": 10},
                        "fps_and_num_frames": {"do_sample_frames": True, "fps": 2, "num_frames": 8}},
}


def _copy(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.suffix == ".xz":
            (dst / f.stem).write_bytes(lzma.decompress(f.read_bytes()))
        elif f.suffix == ".gz":
            (dst / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
        elif f.suffix != ".md":
            shutil.copy(f, dst / f.name)


def materialize(root: Path, families=tuple(FAMILY_DIRS)) -> dict[str, Path]:
    """Write each family's folder under root (decompressed); returns family -> folder."""
    out = {}
    for family in families:
        d = root / FAMILY_DIRS[family]
        if not (d / "config.json").exists():
            d.mkdir(parents=True, exist_ok=True)
            _copy(MODELS / FAMILY_DIRS[family], d)
            if family in _QWEN2_BPE:
                _copy(MODELS / "qwen2-bpe", d)
        out[family] = d
    return out


@functools.lru_cache(maxsize=8)
def processor(folder: str | Path):
    """transformers' AutoProcessor of a checkpoint folder, offline, loaded once per process: the oracle many
    tests call read-only (a large tokenizer.json takes seconds to parse each time)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(folder), local_files_only=True)


def video_variant(folder: Path, family: str, config: str) -> Path:
    """``folder`` itself for "default"; else a sibling copy with that video_preprocessor_config.json."""
    cfg = VIDEO_CONFIGS[family][config]
    if cfg is None:
        return folder
    d = folder.parent / f"{folder.name}.{config}"
    if not (d / "video_preprocessor_config.json").exists():
        shutil.copytree(folder, d, dirs_exist_ok=True)
        (d / "video_preprocessor_config.json").write_text(
            json.dumps({"video_processor_type": _VIDEO_PROCESSOR[family], **cfg}, indent=2) + "\n")
    return d


QWEN_DIRS = {"qwen2.5-vl": "Qwen2.5-VL-7B-Instruct", "qwen3-vl": "Qwen3-VL-8B-Instruct"}


def qwen_folder(root: Path, family: str) -> Path:
    """A Qwen2.5-VL / Qwen3-VL checkpoint folder: the fixture's files and the bundled tokenizer trimmed to the
    model's own added tokens (transformers builds the real processor from it)."""
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.tokenizers import tokenizer_for

    d = root / QWEN_DIRS[family]
    if not (d / "tokenizer.json").exists():
        shutil.copytree(MODELS / QWEN_DIRS[family], d, dirs_exist_ok=True)
        tokenizer_for(load_profile(family)).save(str(d / "tokenizer.json"))
    return d
