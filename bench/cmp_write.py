"""The writer's output bytes of this code against a baseline's: the same inputs through `pack-assets run` (or
`demo`) of each code, every output file compared byte for byte (`cmp`). A check, not a timing.

    git archive main pack_assets | tar -x -C /tmp/base
    python bench/cmp_write.py --baseline-src /tmp/base --out /tmp/cmpw

Cases: copy mode (16 KB media; and in output shards of 3 packs, several to a writer's job), index mode, 100 KB
media (copied in kernel), records with extra members and `.txt` records (and `.json` records not as `json.dumps`
writes them: indented, escaped, floats), the demo set, a two-dataset recipe. Exit 1 on any difference or missing file.
"""

from __future__ import annotations

import argparse
import filecmp
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_shards  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _jpeg(rng: np.random.Generator, w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def mixed_set(root: Path, per_shard: int = 60) -> None:
    """Records with extra members (.cls, .npy), `.txt` records beside an image, `.json` records in forms
    `json.dumps` does not write (indented, \\u escapes, floats with exponents, non-ASCII)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for s in range(2):
        with tarfile.open(root / f"mixed-{s:03d}.tar", "w", format=tarfile.PAX_FORMAT) as tf:
            def add(name: str, data: bytes) -> None:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime = len(data), 0
                tf.addfile(ti, io.BytesIO(data))
            for j in range(per_shard):
                key, kind = f"m{s}_{j:04d}", j % 4
                words = " ".join(["caption words here"] * int(rng.integers(1, 30)))
                if kind == 0:  # .txt record with its image
                    add(f"{key}.jpg", _jpeg(rng, 64, 48))
                    add(f"{key}.txt", f"Ünïcode caption {j}: {words}\n".encode())
                    continue
                rec = {"conversations": [{"from": "human", "value": "<image>\n" + words},
                                         {"from": "gpt", "value": f"answer \u00e9 \u4e2d {j} \"quoted\" / {words}"}],
                       "score": 1e-5 * j, "id": j}
                text = (json.dumps(rec, indent=1) if kind == 1 else json.dumps(rec, ensure_ascii=True) if kind == 2
                        else json.dumps(rec, separators=(",", ":"), ensure_ascii=False))
                add(f"{key}.json", text.encode())
                add(f"{key}.jpg", _jpeg(rng, 80, 60))
                add(f"{key}.cls", str(j % 5).encode())
                add(f"{key}.npy", bytes(rng.integers(0, 255, 40 + j, dtype=np.uint8)))


def cases(data: Path) -> dict[str, list[str]]:
    """Each case's command line after `pack-assets` (run in its own folder; `{work}`, `{out}` filled in)."""
    small, big, mixed = data / "small", data / "big", data / "mixed"
    make_shards(small, 2, 300, image_kb=16, images=2)
    make_shards(big, 1, 120, image_kb=100, images=2, seed=3)
    mixed_set(mixed)
    recipe = data / "recipe.yaml"
    recipe.write_text(f"datasets:\n  - {{name: small, input: {small}, repeat: 1.0}}\n"
                      f"  - {{name: mixed, input: {mixed}, repeat: 1.5}}\nmax_len: 8192\nepochs: 2\nseed: 0\n")
    run = ["run", "--work", "{work}", "--output", "{out}"]
    return {"copy": [*run, "--input", str(small), "--max-len", "8192"],
            # many small output shards: the writer's jobs hold several (a thread writes one while the next is
            # prepared), each job's rows staged
            "copy_small_shards": [*run, "--input", str(small), "--max-len", "8192", "--max-packs-per-shard", "3"],
            "index": [*run, "--input", str(small), "--max-len", "8192", "--mode", "index"],
            "media100k": [*run, "--input", str(big), "--max-len", "16384"],
            "extras_txt": [*run, "--input", str(mixed), "--max-len", "4096"],
            "demo": ["demo", "--work", "{work}", "--output", "{out}"],
            "recipe": ["run", "--recipe", str(recipe), "--work", "{work}", "--output", "{out}"]}


def run_case(src: Path, argv: list[str], cwd: Path, tag: str) -> Path:
    # the same output folder name for both codes: the folder's name is in its wids-index.json
    out, work, home = cwd / tag / "packed", cwd / tag / "work", cwd / tag / "home"
    shutil.rmtree(cwd / tag, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [a.format(work=work, out=out) for a in argv] + ["--dagster-home", str(home)]
    proc = subprocess.run([sys.executable, "-m", "pack_assets.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tag} {argv}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return out


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    bad = [f"only in one: {sorted(set(map(str, files_a)) ^ set(map(str, files_b)))}"] if files_a != files_b else []
    bad += [str(f) for f in files_a if f in files_b and not filecmp.cmp(a / f, b / f, shallow=False)]
    return len(files_a), bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--this-src", default=str(REPO), help="the code to check (default: this checkout)")
    ap.add_argument("--out", default="bench/out/cmp_write")
    ap.add_argument("--cases", nargs="*", help="only these cases (default: all)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    failed = False
    for name, argv in cases(out / "data").items():
        if args.cases and name not in args.cases:
            continue
        cwd = out / name
        cwd.mkdir(parents=True, exist_ok=True)
        base = run_case(Path(args.baseline_src).resolve(), argv, cwd, "baseline")
        this = run_case(Path(args.this_src).resolve(), argv, cwd, "this")
        n, bad = compare(base, this)
        failed |= bool(bad) or n == 0
        print(json.dumps({"case": name, "files": n, "differ": bad}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
