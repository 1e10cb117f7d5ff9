"""`pack-assets run` refuses what its folders and settings alone rule out before it scans anything (issue 37):
one line on stderr, exit 2, no work folder, no `.pack_assets.lock`, no Dagster home, nothing written.
Each case runs the real command in its own process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import small_dataset, write_tar

import pack_assets

REPO = Path(pack_assets.__file__).resolve().parent.parent


def _foreign_shard(t: Path) -> None:
    write_tar(t / "out" / "packed-000000.tar", [("x.txt", "a user's own shard")])


def _foreign_nv_meta(t: Path) -> None:
    (t / "out" / ".nv-meta").mkdir(parents=True)
    (t / "out" / ".nv-meta" / "dataset.yaml").write_text("__class__: MyOwnDataset\n")


def _foreign_index(t: Path) -> None:
    (t / "out").mkdir()
    (t / "out" / "pack_index.json").write_text("{}")


def _config(text: str):
    return lambda t: (t / "config.json").write_text(text)


def _recipe(text: str):
    return lambda t: (t / "recipe.yaml").write_text(text)


RECIPE = "datasets:\n  - {name: a, input: in, repeat: %s}\nmax_len: 1500\n"
CASES = {
    "foreign output shard": (_foreign_shard, [], "refusing to overwrite files in {t}/out .*: packed-000000.tar"),
    "foreign .nv-meta": (_foreign_nv_meta, [], r"\.nv-meta/dataset.yaml \(`.nv-meta/` here was not written"),
    "foreign index in index mode": (_foreign_index, ["--mode", "index"], "pack_index.json"),
    "output inside the input": (None, ["--output", "{t}/in/out"], "the output folder {t}/in/out lies inside the input"),
    "work inside the input": (None, ["--work", "{t}/in/work"], "the work folder {t}/in/work lies inside the input"),
    "work inside the output": (None, ["--work", "{t}/out/work"], "the work folder {t}/out/work lies inside the output"),
    "missing input": (None, ["--input", "{t}/nowhere"], "input directory {t}/nowhere does not exist"),
    "input without shards": (lambda t: (t / "empty").mkdir(), ["--input", "{t}/empty"], "no \\*.tar shards under"),
    "unknown profile": (None, ["--profile", "qwen9"], "unknown profile 'qwen9'"),
    "unknown setting": (_config('{"max_lenght": 4096}'), ["--config", "{t}/config.json"],
                        "unknown setting 'max_lenght'"),
    "setting of the wrong type": (_config('{"max_samples_per_pack": "8"}'), ["--config", "{t}/config.json"],
                                  "setting 'max_samples_per_pack' must be an integer, got '8'"),
    "unknown algorithm": (None, ["--algorithm", "best"], "unknown algorithm 'best'"),
    "recipe with a bad repeat": (_recipe(RECIPE % -1), ["--recipe", "{t}/recipe.yaml"], "repeat must be a number >= 0"),
    "recipe that is not YAML": (_recipe("datasets: [\n"), ["--recipe", "{t}/recipe.yaml"], "not valid YAML"),
    "recipe with a missing input": (_recipe(RECIPE.replace("input: in", "input: gone") % 1),
                                    ["--recipe", "{t}/recipe.yaml"], "input folder {t}/gone does not exist"),
    "recipe with a foreign epoch shard": (lambda t: (_recipe(RECIPE % 1)(t), write_tar(
        t / "out" / "epoch-000" / "packed-000003.tar", [("x.txt", "mine")])), ["--recipe", "{t}/recipe.yaml"],
        "epoch-000 .*packed-000003.tar"),
}


def _args(extra: list[str], t: Path) -> list[str]:
    given = [a.format(t=t) for a in extra]
    base = {"--input": f"{t}/in", "--work": f"{t}/work", "--output": f"{t}/out", "--max-len": "1500"}
    if "--recipe" in given:
        base.pop("--input")
        base.pop("--max-len")
    for flag in list(base):
        if flag in given:
            base.pop(flag)
    return [*(x for kv in base.items() for x in kv), *given, "--dagster-home", f"{t}/dh"]


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_any_scan_in_one_line_and_nothing_left(case, tmp_path):
    make, extra, expected = CASES[case]
    small_dataset(tmp_path / "in", n_shards=1, per_shard=3)
    if make:
        make(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "pack_assets.cli", "run", *_args(extra, tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith("error: ") and re.search(expected.format(t=tmp_path), line), line
    # nothing scanned, locked or written (no work folder, no .pack_assets.lock, no Dagster home): as it was
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
