"""The benchmark records stay honest: a results file is never overwritten (bench/common.py's writer, the one way
the bench scripts write theirs), and every `bench/results/...` file docs/benchmarks.md names is in the repository."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


def bench_common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_results_file_is_never_overwritten(tmp_path):
    common = bench_common()
    kept = tmp_path / "run.json"
    kept.write_text('{"figure": 1}\n')
    with pytest.raises(SystemExit, match="never overwritten"):
        common.ResultsFile(kept, "run")  # refused as the run starts, before anything is measured
    assert kept.read_text() == '{"figure": 1}\n'

    late = common.ResultsFile(tmp_path / "late.json", "late")
    (tmp_path / "late.json").write_text("another run's\n")  # appears while this run measures
    with pytest.raises(SystemExit, match="never overwritten"):
        late.write({"figure": 2})
    assert (tmp_path / "late.json").read_text() == "another run's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.json", "run.json"]  # no temporary left


def test_a_folder_gets_a_new_file_that_the_run_may_update(tmp_path):
    common = bench_common()
    first = common.ResultsFile(tmp_path, "e2e")
    assert re.fullmatch(r"e2e_\d{8}T\d{6}Z\.json", first.path.name) and first.path.parent == tmp_path
    first.write([{"full_run_s": 1.0}])
    first.write([{"full_run_s": 1.0}, {"rerun_s": 0.1}])  # its own file, record by record
    assert json.loads(first.path.read_text()) == [{"full_run_s": 1.0}, {"rerun_s": 0.1}]
    with pytest.raises(SystemExit, match="never overwritten"):
        common.ResultsFile(first.path, "e2e")
    assert common.ResultsFile(None, "x").path.parent == ROOT / "bench" / "results"


def test_every_bench_script_writes_its_results_through_the_writer():
    for script in sorted((ROOT / "bench").glob("*.py")):
        text = script.read_text()
        if script.name in ("common.py", "plots.py") or "results" not in text:
            continue
        assert "ResultsFile(" in text or "Results(" in text, f"{script.name} writes results without the writer"
        assert not re.search(r"default=[^,)]*results/[\w.-]+\.json", text), f"{script.name}: a fixed results name"


def named_results(text: str) -> set[str]:
    """Every bench/results/ file the text names, `{a,b}` expanded; placeholders (`<case>`) left out."""
    names = set()
    for m in re.finditer(r"bench/results/([\w.{},-]*\.jsonl?)", text):
        name = m.group(1)
        brace = re.search(r"\{([^}]*)\}", name)
        names |= {name[:brace.start()] + alt + name[brace.end():] for alt in brace.group(1).split(",")} if brace \
            else {name}
    return names


def test_every_results_file_the_benchmarks_doc_names_exists():
    names = named_results(DOC.read_text())
    assert len(names) > 50  # the doc's records, not a regex that finds nothing
    missing = sorted(n for n in names if not (ROOT / "bench" / "results" / n).is_file())
    assert not missing, f"docs/benchmarks.md names results files that are not in bench/results: {missing}"
    assert named_results("bench/results/e2e_{a,b}.json and bench/results/stages-<case>.json") == {"e2e_a.json",
                                                                                                  "e2e_b.json"}
