"""The checkpoint folders of the fast-rule families, built from tests/fixtures/models (big files stored
compressed; see tests/fixtures/README.md). Shared by tests/test_families.py and scripts/make_oracle.py, so the
oracle and the tests read the same files."""

from __future__ import annotations

import gzip
import lzma
import shutil
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
FAMILY_DIRS = {"internvl": "InternVL3-2B-hf.RECONSTRUCTED", "llava-onevision": "llava-onevision-qwen2-7b-ov-hf.RECONSTRUCTED",
               "gemma3": "gemma-3-4b-it"}
_QWEN2_BPE = ("internvl", "llava-onevision")  # vocab.json + merges.txt stored once in qwen2-bpe/


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
