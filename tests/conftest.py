"""Shared test helpers: small tar shards made on the fly."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from PIL import Image


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis' storage (the constants it reads from the source files, written on every run, at collection
    already; the example database) in a temporary folder of this process, removed at its end: not `.hypothesis/`
    in the checkout, so no test writes outside its temporary folders. Set on Hypothesis if it is imported (its
    storage path is then fixed), else in the environment, which it reads when first imported."""
    home = tempfile.mkdtemp(prefix="pack_assets_hypothesis-")
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    if "hypothesis" in sys.modules:
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(home)
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = home


# The modules holding the suite's longest tests, run first (each module's tests kept together and in their order,
# the other modules after them in pytest's order): on several workers (pytest-xdist) the last tests handed out
# are then short ones, so no worker runs a minute-long test alone at the end while the other waits.
# bench/xdist_schedule.py replays the schedule from measured costs.
SLOW_FIRST = ("test_lifecycle_property.py", "test_ui.py", "test_celery.py", "test_dagster.py", "test_faults.py",
              "test_reliability.py", "test_packed_equals_unpacked.py", "test_trainers.py", "test_families.py",
              "test_procount_videos.py", "test_processor_rule.py", "test_family_encoders.py", "test_chunkcount.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the rest keep their order


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-snapshot", action="store_true", default=False,
                     help="rewrite tests/snapshots/asset_graph.json from the current definitions")


@pytest.fixture(autouse=True, scope="session")
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tokenizer table cache (core/counting/tokenizers.py) in a folder of this session, not the user's ~/.cache;
    set in the environment so the CLI's subprocesses and workers use it too."""
    os.environ.setdefault("PACK_ASSETS_CACHE", str(tmp_path_factory.mktemp("pack_assets_cache")))


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fast-rule families' checkpoint folders (tests/family_fixtures.py), decompressed once per session
    process and read by every module: the tokenizers, rules and processors the product keeps per file path
    (functools caches) then load once per process, as in a real run, not once per module. Read-only: a test
    that needs a changed folder copies it (family_fixtures.video_variant writes a sibling)."""
    from family_fixtures import materialize

    return materialize(tmp_path_factory.mktemp("family_models"))


# Tests that look at the report's figures (their bytes, sizes, or the UI showing them): they draw them for real.
# Every other test's runs draw a stand-in PNG (tests/figure_stand_in.py); `pack-assets` and `dagster` commands run
# as subprocesses always draw the real ones.
REAL_FIGURES = ("tests/test_drawing.py", "tests/test_ui.py",
                "tests/test_packed_shards_and_audit.py::test_audit_passes_on_clean_output_and_counts_add_up",
                "tests/test_cli.py::test_plan_and_simulate_on_a_lengths_file",
                "tests/test_dagster.py::test_shard_workers_scan_before_dagster_and_the_runs_record_every_shard")


@pytest.fixture(autouse=True)
def _figures_stand_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's five figures drawn as a 1 x 1 PNG for the test, unless it is one of REAL_FIGURES: a PNG costs
    ~0.25 CPU s with matplotlib, five per run of the tiny inputs, and most tests run the pipeline several times
    without looking at one. In the test's process and for the figures it hands to the command's helper processes
    (the swapped function is pickled by its module's name, tests/figure_stand_in.py); not for the what-if's two,
    which a side helper draws with its own module's functions (forked from a fork server: no swap there)."""
    if request.node.nodeid.startswith(REAL_FIGURES):
        return
    import figure_stand_in

    from pack_assets.core import report

    for name in figure_stand_in.FIGURES:
        monkeypatch.setattr(report, name, figure_stand_in.draw)


def needs(missing: bool, reason: str) -> pytest.MarkDecorator:
    """skipif for a test that needs an optional package. `.ci/run` sets PACK_ASSETS_CI=1 once it has installed
    them all, and there a missing one is a collection error: a test CI must run never skips unseen."""
    if missing and os.environ.get("PACK_ASSETS_CI") == "1":
        pytest.fail(f"PACK_ASSETS_CI=1, yet {reason}", pytrace=False)
    return pytest.mark.skipif(missing, reason=reason)


def image_bytes(w: int = 64, h: int = 48, fmt: str = "JPEG", color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format=fmt)
    return buf.getvalue()


def add(tf: tarfile.TarFile, name: str, data: bytes | str) -> None:
    if isinstance(data, str):
        data = data.encode()
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), 0
    tf.addfile(ti, io.BytesIO(data))


def write_tar(path: Path, members: list[tuple[str, bytes | str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            add(tf, name, data)
    return path


def chat(question: str = "What is shown?", answer: str = "A red square.", images: int = 0) -> dict:
    return {"conversations": [{"from": "human", "value": "<image>\n" * images + question},
                              {"from": "gpt", "value": answer}]}


def small_dataset(root: Path, n_shards: int = 2, per_shard: int = 12) -> Path:
    """Text, single-image and two-image samples in both chat styles, plus one bad sample per shard."""
    for s in range(n_shards):
        members: list[tuple[str, bytes | str]] = []
        for j in range(per_shard):
            key = f"s{s}_{j:03d}"
            kind = j % 3
            words = " ".join(["word"] * (5 + 37 * j % 200))
            if kind == 0:
                rec = {"messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": f"Tell me {j}: {words}"},
                                    {"role": "assistant", "content": "Sure. " + words}]}
                members.append((f"{key}.json", json.dumps(rec)))
            elif kind == 1:
                members.append((f"{key}.json", json.dumps({**chat(words, "ok", images=1), "image": "jpg"})))
                members.append((f"{key}.jpg", image_bytes(32 + j * 20, 40 + j * 7)))
            else:
                rec = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                                   {"type": "text", "text": "Compare " + words}]},
                                    {"role": "assistant", "content": [{"type": "text", "text": "They differ."}]}],
                       "images": ["a.png", "b.webp"]}
                members.append((f"{key}.json", json.dumps(rec)))
                members.append((f"{key}.a.png", image_bytes(100 + j, 80, "PNG", (j, 2 * j, 3 * j))))
                members.append((f"{key}.b.webp", image_bytes(300, 200 + j, "WEBP")))
        members.append((f"bad{s}.json", "{not json"))
        write_tar(root / f"part-{s:03d}.tar", members)
    return root


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return small_dataset(tmp_path / "in")


def appended_catalog(root: Path) -> tuple[Path, list[str]]:
    """Four shards counted, three planned, then the fourth appended by the incremental plan (its samples in new
    output shards, as after a new shard): the work folder and the shards."""
    from pack_assets.core import store
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.scan import run_manifest

    profile = load_profile("qwen3-vl")
    inp, work = small_dataset(root / "in", n_shards=4, per_shard=6), root / "work"
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    config = PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True)
    run_plan(work, shards[:3], config, profile)
    run_plan(work, shards, config, profile)
    return work, shards


class SqlSpy:
    """A connection whose statements are kept (DuckDB's own connection takes no attribute)."""

    def __init__(self, con) -> None:
        self.con, self.sql = con, []

    def execute(self, sql, *args):
        self.sql.append(sql)
        return self.con.execute(sql, *args)
