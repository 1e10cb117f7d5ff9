"""Instructions per JSON document of each way to read or write it (stdlib json, orjson, core/jsonform.py), counted
by valgrind's cachegrind: a fresh interpreter reads the documents once and runs one way over them; the same run
without the way is subtracted. Documents: the JSON records of a source shard, and the ``_meta`` object of each
pack document of an output shard (as the audit's `packdoc.walk` reads it: from its place to the document's end).

    python -P bench/json_instructions.py --shard <source shard .tar> [--packed <output shard .tar>] \\
        --code <checkout> [--results <new file>]

Ways (``--ways``, default all): ``scan_once`` (json's scanner: the scan's read before session 54),
``orjson_loads`` (orjson alone: not json's value for every text), ``loads_form`` (jsonform's, the scan's now),
``dumps_c`` (json's C encoder, json's quoting), ``dumps_long`` (jsonform.dumps with the long-strings hint: orjson
quotes the long strings), ``meta_raw_decode`` and ``meta_loads`` (the ``_meta`` object by json's scanner and by
jsonform.loads). Load on the machine does not move the counts; hash randomization is fixed (PYTHONHASHSEED=0).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_CHILD = r"""
import json, sys, tarfile
from pack_assets.core import jsonform
shard, packed, way, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def members(path, suffix, limit):
    out = []
    with tarfile.open(path) as tf:
        for m in tf:
            if m.name.endswith(suffix):
                out.append(tf.extractfile(m).read())
                if len(out) >= limit:
                    break
    return out

if way.startswith("meta_"):
    docs = [d.decode() for d in members(packed, ".json", n)]
    at = [d.index('"_meta": ') + len('"_meta": ') for d in docs]
    raw_decode = json.JSONDecoder().raw_decode
    if way == "meta_raw_decode":
        for d, p in zip(docs, at):
            raw_decode(d, p)
    elif way == "meta_loads":
        for d, p in zip(docs, at):
            jsonform.loads(d[p:-1])
else:
    utf8 = members(shard, ".json", n)
    texts = [b.decode() for b in utf8]
    values = [json.loads(t) for t in texts]
    scan_once = json.JSONDecoder().scan_once
    if way == "scan_once":
        for t in texts:
            scan_once(t, 0)
    elif way == "orjson_loads":
        import orjson
        for b in utf8:
            orjson.loads(b)
    elif way == "loads_form":
        for t, b in zip(texts, utf8):
            jsonform.loads_form(t, b)
    elif way == "dumps_c":
        for v in values:
            jsonform.dumps(v)
    elif way == "dumps_long":
        for v in values:
            jsonform.dumps(v, True)
    docs = texts
print("docs", len(docs))
"""

WAYS = ["scan_once", "orjson_loads", "loads_form", "dumps_c", "dumps_long", "meta_raw_decode", "meta_loads"]


def _count(code: Path, shard: Path, packed: Path | None, way: str, n: int) -> tuple[int, int]:
    """(instructions, documents) of a fresh interpreter running ``way`` (or nothing: "none", "meta_none")."""
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                           sys.executable, "-P", "-c", _CHILD, str(shard), str(packed or ""), way, str(n)],
                          env={**os.environ, "PYTHONPATH": str(code), "PYTHONHASHSEED": "0"},
                          capture_output=True, text=True)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    docs = re.search(r"^docs (\d+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not refs or not docs:
        raise SystemExit(f"{way}: {proc.stderr[-3000:]}\n{proc.stdout[-500:]}")
    return int(refs.group(1).replace(",", "")), int(docs.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shard", type=Path, required=True, help="a source shard (.tar): its JSON records")
    ap.add_argument("--packed", type=Path, help="an output shard (.tar): its pack documents' _meta")
    ap.add_argument("--code", type=Path, required=True, help="a checkout holding pack_assets")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--docs", type=int, default=2000, help="documents at most (default 2000)")
    ap.add_argument("--results")
    args = ap.parse_args()
    out = ResultsFile(args.results, "json_instructions")
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "shard": str(args.shard), "packed": str(args.packed), "code": str(args.code), "ways": {}}
    ways = [w for w in args.ways.split(",") if w and (args.packed or not w.startswith("meta_"))]
    base = {}
    for kind in sorted({"meta_none" if w.startswith("meta_") else "none" for w in ways}):
        base[kind] = _count(args.code.resolve(), args.shard.resolve(), args.packed, kind, args.docs)
    for way in ways:
        refs, docs = _count(args.code.resolve(), args.shard.resolve(), args.packed, way, args.docs)
        none, _ = base["meta_none" if way.startswith("meta_") else "none"]
        doc["ways"][way] = {"documents": docs, "instructions_per_document": round((refs - none) / docs)}
        print(way, doc["ways"][way], flush=True)
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
