"""A stand-in for the report's figure functions (core/report.py `draw_*`) in tests that never look at a figure's
pixels (tests/conftest.py swaps them in): a run of the tiny test inputs spends most of a core-second per
`run_audit` and per what-if sweep drawing PNGs with matplotlib, in the test's process or in the command's
helper processes. A module of its own, light to import: a helper process unpickles the function by its
module's name, so the swap reaches the figures drawn there too. Tests that read figures keep the real
functions (conftest.REAL_FIGURES), as does every `pack-assets` or `dagster` command run as a subprocess; the
kill harnesses (fault_harness.py, lifecycle_harness.py) swap them in with `swap()`."""

from __future__ import annotations

from pathlib import Path

FIGURES = ("draw_lengths", "draw_fill", "draw_reasons", "draw_distribution", "draw_fill_vs_max_len")

# a valid 1 x 1 grey PNG: what the report links and inlines is still a PNG file at the figure's path
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x00:~\x9bU\x00\x00\x00"
       b"\nIDATx\x9cc\xf8\x0f\x00\x01\x01\x01\x00\xb18\xf6\x14\x00\x00\x00\x00IEND\xaeB`\x82")


def draw(data, path: Path) -> None:
    """What a `draw_*` function leaves: a PNG file at ``path`` (its folder made), written in place as matplotlib's
    `savefig` writes it (no rename: tests/test_faults.py follows every rename to its folder's fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PNG)


def swap() -> None:
    """The report's figure functions replaced by `draw` in this process (a harness run as a subprocess)."""
    from pack_assets.core import report

    for name in FIGURES:
        setattr(report, name, draw)
