"""The audit's outcome, this code against a baseline's, on one finished run: equal or not, clean and with faults.

    python bench/audit_equality.py --work <run>/work --packed <run>/packed --baseline-src /work/main \
        --results bench/results/audit_equality_<name>.json

For each code (this checkout, the package at --baseline-src), each way of reading the shards (in line: one
worker; two threads; two processes) and each audit (full: no record of an earlier clean audit; default: scope
"all" after this code's clean full audit, unchanged shards hashed against its record; changed: scope "changed"
after it; verify: every shard checked in full, none by its digest), `run_audit` runs in a fresh process
(python -P) and gives its verdict, violations, stats, audit_report.md and audited_shards.json. Then the same
with faults planted in place (a flipped byte in one media member, one letter changed in one packed
conversation, one member's bytes of another shard: each the same size, so the tars stay readable; with three
output shards or more, in the middle one: a pack's record made no JSON, a sample id changed in a pack's ``_meta``,
the shard cut short inside its last pack), put back after. Each outcome must be equal between the two codes; any
difference is listed (and the exit code is 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
MODES = {"inline": {"workers": 1}, "threads": {"workers": 2, "parallel_min_bytes": 1 << 62},
         "processes": {"workers": 2, "parallel_min_bytes": 0}}
AUDITS = {"full": {}, "default": {}, "changed": {"scope": "changed"}, "verify": {"digests": False}}

_ONE = """
import json, sys
from pathlib import Path
from pack_assets.core import audit
work, out, kw = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
r = audit.run_audit(work, out, recount_fraction=0.05, **kw)
record = work / audit.AUDITED
print(json.dumps({"verdict": r.verdict, "violations": r.violations, "stats": r.stats,
                  "report": r.report.read_text(), "record": record.read_text() if record.exists() else None}))
"""


def run(src: Path, work: Path, packed: Path, kw: dict) -> dict:
    p = subprocess.run([sys.executable, "-P", "-c", _ONE, str(work), str(packed), json.dumps(kw)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)})
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def outcomes(src: Path, work: Path, packed: Path, plant=None) -> dict:
    """Each mode's and audit's outcome for one code; ``plant``: called after the clean full audit, before the
    others (the faults then meet a record that vouched for the clean shards); it returns what puts them back."""
    record = work / "audited_shards.json"
    found = {}
    for mode, kw in MODES.items():
        record.unlink(missing_ok=True)
        found[f"{mode} clean-full"] = run(src, work, packed, kw)
        clean = record.read_bytes()
        restore = plant() if plant else None
        try:
            for name, extra in AUDITS.items():
                if name == "full":
                    record.unlink(missing_ok=True)
                else:
                    record.write_bytes(clean)
                found[f"{mode} {name}"] = run(src, work, packed, {**kw, **extra})
        finally:
            if restore:
                restore()
    return found


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as t:
        return t.getmembers()


def planter(packed: Path):
    """Three same-size faults in two output shards, written in place, and with three output shards or more, three
    in the middle one (a pack's record made no JSON, a pack's sample id changed in its ``_meta``, the shard cut
    short); returns the function that plants them."""
    shards = sorted(packed.glob("*.tar"))
    first, last = _members(shards[0]), _members(shards[-1])
    middle = _members(shards[1]) if len(shards) >= 3 else []
    docs = [m for m in middle if m.name.endswith(".json")]
    media = next(m for m in first if not m.name.endswith((".json", ".idx")) and m.size > 100)
    doc = next(m for m in last if m.name.endswith(".json"))
    other = next(m for m in last if not m.name.endswith(".json") and m.size > 100 and m.name != media.name)

    def plant():
        saved, times = [], {}

        def put(path: Path, at: int, data: bytes) -> None:
            if path not in times:
                st = path.stat()
                times[path] = (st.st_atime_ns, st.st_mtime_ns)
            with open(path, "r+b") as f:
                f.seek(at)
                saved.append((path, at, f.read(len(data))))
                f.seek(at)
                f.write(data)

        with open(shards[0], "rb") as f:
            f.seek(media.offset_data + 50)
            put(shards[0], media.offset_data + 50, bytes([f.read(1)[0] ^ 0xFF]))
        with open(shards[-1], "rb") as f:
            f.seek(doc.offset_data)
            text = f.read(doc.size)
        at = text.index(b'"text": "') + len(b'"text": "') + 3  # a letter inside the first text of the first turn
        put(shards[-1], doc.offset_data + at, b"Q" if text[at:at + 1] != b"Q" else b"R")
        with open(shards[-1], "rb") as f:
            f.seek(other.offset_data)
            put(shards[-1], other.offset_data, f.read(other.size)[::-1])  # its bytes reversed
        cut = None
        if len(docs) >= 3:
            with open(shards[1], "rb") as f:
                f.seek(docs[0].offset_data)
                text = f.read(docs[0].size)
                f.seek(docs[1].offset_data)
                second = f.read(docs[1].size)
            at = text.index(b'"source": {') + len(b'"source": {') + 1  # a record's first key opened by no quote
            put(shards[1], docs[0].offset_data + at - 1, b"'")
            at = second.index(b'"sample_ids": ["') + len(b'"sample_ids": ["') + 2  # a letter of _meta's first id
            put(shards[1], docs[1].offset_data + at, b"Q" if second[at:at + 1] != b"Q" else b"R")
            cut = shards[1].stat().st_size - docs[-1].size // 2 - 1024  # inside the last pack's document
            with open(shards[1], "rb") as f:
                f.seek(cut)
                tail = f.read()
            os.truncate(shards[1], cut)

        def restore():
            if cut is not None:
                with open(shards[1], "ab") as f:
                    f.write(tail)
            for path, at, data in reversed(saved):
                with open(path, "r+b") as f:
                    f.seek(at)
                    f.write(data)
            for path, ns in times.items():  # the stamps the next clean audit records are the first's (mtime)
                os.utime(path, ns=ns)
        return restore

    return plant


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--packed", required=True)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--cases", default="clean,faults", help="which of clean, faults (comma-separated)")
    ap.add_argument("--results")
    args = ap.parse_args()
    work, packed = Path(args.work), Path(args.packed)
    record = work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    results = ResultsFile(args.results, "audit_equality")
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "baseline_src": args.baseline_src, "load_before": os.getloadavg(), "cases": {}}
    try:
        plant = planter(packed)
        for case, planted in (c for c in (("clean", None), ("faults", plant)) if c[0] in args.cases.split(",")):
            this, base = outcomes(HERE, work, packed, planted), outcomes(Path(args.baseline_src), work, packed, planted)
            for label, mine in this.items():
                diff = sorted(k for k in set(mine) | set(base[label]) if mine.get(k) != base[label].get(k))
                doc["cases"][f"{case} {label}"] = {
                    "verdict": mine["verdict"], "equal": not diff, "differs": diff,
                    "violations": dict(sorted(Counter(v["check"] for v in mine["violations"]).items()))}
                print(case, label, doc["cases"][f"{case} {label}"], flush=True)
        doc["all_equal"] = all(c["equal"] for c in doc["cases"].values())
        results.write(doc)
        print(json.dumps({"all_equal": doc["all_equal"]}))
    finally:
        if saved is not None:
            record.write_bytes(saved)
    sys.exit(0 if doc.get("all_equal") else 1)


if __name__ == "__main__":
    main()
