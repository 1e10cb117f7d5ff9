"""What the stages' typed summaries share: ``as_metadata()`` returns plain values; these markers say how
the Dagster layer should show a value (JSON is implied by a dict or a list)."""

from __future__ import annotations

import base64
from pathlib import Path


class Markdown(str):
    """A markdown table or text (with inline plots)."""


class FilePath(str):
    """A file or folder the user may want to open."""


def png_data_uri(path: Path) -> str:
    """A PNG inlined into markdown (the UI shows metadata markdown without serving files)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()
