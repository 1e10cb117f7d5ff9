"""Checkpoint folders with a thinking model's chat template: the Qwen3-VL fixture (tests/fixtures/models) with
its template replaced by one of tests/fixtures/templates (see tests/fixtures/README.md for where each came
from) and the bundled Qwen3 tokenizer.json, so transformers builds the real Qwen3-VL processor from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPLATES = {"qwen3-vl-thinking": "qwen3-vl-thinking.jinja", "qwen3.6": "qwen3.6.jinja"}


def thinking_folder(root: Path, template: str) -> Path:
    """A Qwen3-VL checkpoint folder (configs, tokenizer) whose chat template is ``TEMPLATES[template]``."""
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.tokenizers import tokenizer_for

    d = root / f"Qwen3-VL.{template}"
    if (d / "chat_template.json").exists():
        return d
    shutil.copytree(FIXTURES / "models" / "Qwen3-VL-8B-Instruct", d)
    text = (FIXTURES / "templates" / TEMPLATES[template]).read_text(encoding="utf-8")
    (d / "chat_template.json").write_text(json.dumps({"chat_template": text}, indent=2), encoding="utf-8")
    tokenizer_for(load_profile("qwen3-vl")).save(str(d / "tokenizer.json"))  # Qwen3-VL's own 26 added tokens
    return d
