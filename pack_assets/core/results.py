"""What the stages' typed summaries share: ``as_metadata()`` returns plain values; these markers say how
the Dagster layer should show a value (JSON is implied by a dict or a list). Also the audit's result, which
the audit stage fills and the report renders."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path

# how a shard step's log line ends when it found the shard's files current: kept from an earlier run, or
# written just before by this command's helper processes (runner/shardwork.py)
KEPT = {False: " (unchanged, kept)", True: " (by the command's helper processes)"}


def summed(name: str, of: str = "epochs") -> property:
    """A summary's property: the sum of ``name`` over the summaries in its ``of`` list (a blend's epochs)."""
    return property(lambda self: sum(getattr(part, name) for part in getattr(self, of)))


class Markdown(str):
    """A markdown table or text (with inline plots)."""


class FilePath(str):
    """A file or folder the user may want to open."""


def png_data_uri(path: Path) -> str:
    """A PNG inlined into markdown (the UI shows metadata markdown without serving files)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


_IMAGE_LINK = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<link>[^)\s]+\.png)\)")


def inline_images(markdown: str, base: Path) -> Markdown:
    """A markdown file's relative PNG links (audit_report.md's ``plots/*.png``) as data URIs: the UI resolves
    no path relative to a file it never sees, and showed each as a broken image. A missing file becomes its
    alt text, not a broken image."""
    def inline(m: re.Match) -> str:
        if ":" in m["link"]:  # data:, http(s): already resolvable
            return m[0]
        path = base / m["link"]
        return f"![{m['alt']}]({png_data_uri(path)})" if path.is_file() else f"*({m['alt']}: {m['link']} missing)*"

    return Markdown(_IMAGE_LINK.sub(inline, markdown))


@dataclass
class AuditResult:
    violations: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)  # shards in the input the plan did not count (core/coverage.py)
    report: Path | None = None  # audit_report.md, once written
    plots: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No violation in what was read (says nothing of shards still waiting: see ``verdict``)."""
        return not self.violations

    @property
    def verdict(self) -> str:
        """PASS, FAIL (a violation) or INCOMPLETE (no violation, but shards of the input are not counted)."""
        return "FAIL" if self.violations else "INCOMPLETE" if self.waiting else "PASS"

    def add(self, check: str, detail: str, **where) -> None:
        self.violations.append({"check": check, "detail": detail, **where})

    def as_metadata(self) -> dict:
        st = self.stats
        plots = "\n\n".join(f"![{k}]({png_data_uri(Path(v))})" for k, v in self.plots.items() if k != "reasons")
        return {**{k: st[k] for k in ("samples_read", "packed", "dropped", "rejected", "media_members_checked",
                                      "output_shards_trusted")}, "split": st.get("split", 0),
                "violations": len(self.violations), "verdict": self.verdict, "shards_waiting": self.waiting,
                "report": FilePath(self.report),
                "report_markdown": inline_images(self.report.read_text(), self.report.parent),
                "plots": Markdown(plots)}
