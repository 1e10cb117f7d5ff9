"""Day two as a property (issue 16): add, remove, replace, edit and corrupt tiny source shards, drop user files in
the output folder, change the packing settings, and run in every way a user can (core stages full or
incremental, `pack-assets run` through Dagster in process, a sensor tick, a killed run then a rerun, and rarely
`dagster asset materialize` as a subprocess). After every run an independent oracle checks the invariants of
DESIGN.md against the source tars read with Python's `tarfile` (never the tool's own scan):

- the run finishes (bad input is a reason row, never a crash that loses the run);
- the audit verdict is true: PASS only when the oracle finds nothing wrong, and PASS after every run;
- every current source sample is packed, dropped or rejected exactly once (catalog and output agree), and no
  sample of a removed or older shard is anywhere in the output;
- every output byte equals the current source: media members and each packed conversation's `source` JSON;
- every other member of a packed sample (an unnamed `.txt`, say) is carried in the pack or has a reason row;
- files the tool did not write (user files in the output folder, the source shards) are untouched;
- a full (non-incremental) run is byte-identical to a from-scratch run on the same input and settings.

`Lifecycle.check` returns the violations as data, so `bench/soak_lifecycle.py` can count them over long runs;
the test asserts there are none.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import dagster as dg
from hypothesis import HealthCheck, note, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).parent))
from conftest import image_bytes  # noqa: E402

from pack_assets.core import report, store  # noqa: E402
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile  # noqa: E402
from pack_assets.core.counting.token_lengths import run_token_lengths, token_lengths_are_current
from pack_assets.core.plan import (
    PlanConfig,  # noqa: E402
    PlanInfo,
    run_plan,
)
from pack_assets.core.scan import manifest_is_current, run_manifest
from pack_assets.core.write import run_write

PROFILE = load_profile("qwen3-vl")
HERE = Path(__file__).parent
HARNESS = HERE / "lifecycle_harness.py"
SHARD_NAMES = ("a", "b", "c", "sub/d", "e")
MAX_LENS = (700, 1100, 1600)
ALGORITHMS = ("bfd", "ffd", "next_fit")
PACKS_PER_SHARD = 2  # several output shards even on tiny data, so rewrites and skips both happen
KILL_POINTS = [("pack_assets.core.write.shard:member_header", 2), ("pack_assets.core.write.shard:os.replace", 1),
               ("pack_assets.core.store:os.replace", 2), ("pack_assets.core.plan:make_plan", 1),
               ("pack_assets.core.store:atomic_write_text", 2)]


# --- plots cost 70 % of a run on tiny data and no invariant looks at them -------------------------------------

class _NoPlot:
    """Stands in for matplotlib figures and axes while the property runs (every call returns itself)."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __iter__(self):
        return iter(())


class _NoPyplot:
    @staticmethod
    def subplots(nrows=1, ncols=1, **kwargs):
        return _NoPlot(), (tuple(_NoPlot() for _ in range(ncols)) if ncols > 1 else _NoPlot())

    @staticmethod
    def close(fig=None):
        pass


def _placeholder_png(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    store.atomic_write_text(path, "plot skipped in test_lifecycle")


@contextlib.contextmanager
def no_plots():
    saved = report.plt, report._save
    report.plt, report._save = _NoPyplot, _placeholder_png
    try:
        yield
    finally:
        report.plt, report._save = saved


# --- source data: a model of each shard, written as a tar --------------------------------------------------------

@dataclass
class SampleSpec:
    key: str
    kind: str  # text | image1 | image2 | overlong | bad
    style: str  # messages | sharegpt
    words: int
    number: str  # digits in the prompt: changing one keeps the byte size and the token count
    more: int = 0  # words appended by an edit (changes the token count)
    size: int = 0  # image size step (a different size: different bytes and length)
    flip: int = 0  # xor into one byte in the middle of each image (same size, different bytes)
    extra: bool = False  # a `.txt` member the record does not name


def _text(s: SampleSpec) -> str:
    n = 2400 if s.kind == "overlong" else s.words
    return f"Item {s.number}: " + " ".join(["word"] * n) + " more" * s.more


def _image(s: SampleSpec, i: int, fmt: str) -> bytes:
    data = bytearray(image_bytes(32 + 8 * s.size + 5 * i, 40 + 4 * s.size, fmt, (40 * i, 90, 200 - 10 * s.size)))
    if s.flip:
        data[len(data) // 2] ^= s.flip
    return bytes(data)


def sample_members(s: SampleSpec) -> list[tuple[str, bytes]]:
    if s.kind == "bad":
        return [(f"{s.key}.json", b"{not json " + s.number.encode())]
    text, media = _text(s), []
    if s.kind in ("text", "overlong"):
        rec = ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text},
                             {"role": "assistant", "content": "Sure."}]} if s.style == "messages" else
               {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "Sure."}]})
    else:
        names = ["jpg"] if s.kind == "image1" else ["a.png", "b.webp"]
        fmts = {"jpg": "JPEG", "a.png": "PNG", "b.webp": "WEBP"}
        media = [(f"{s.key}.{n}", _image(s, i, fmts[n])) for i, n in enumerate(names)]
        if s.style == "messages":
            asked = [{"type": "image"}] * len(names) + [{"type": "text", "text": text}]
            rec = {"messages": [{"role": "user", "content": asked},
                                {"role": "assistant", "content": [{"type": "text", "text": "A picture."}]}],
                   "images": names}
        else:
            rec = {"conversations": [{"from": "human", "value": "<image>\n" * len(names) + text},
                                     {"from": "gpt", "value": "A picture."}], "images": names}
    members = [(f"{s.key}.json", json.dumps(rec).encode())] + media
    if s.extra:
        members.append((f"{s.key}.txt", f"note {s.number}".encode()))
    return members


def tar_bytes(members: list[tuple[str, bytes]], bad_pax_before: int | None = None) -> bytes:
    """What tarfile writes (PAX format, mtime 0), optionally with a malformed PAX record (its length field
    is not a number) in front of member ``bad_pax_before``."""
    buf = io.BytesIO()
    for i, (name, data) in enumerate(members):
        if i == bad_pax_before:
            body = b"xx path=broken\n"
            ti = tarfile.TarInfo("././@PaxHeader")
            ti.type, ti.size = tarfile.XHDTYPE, len(body)
            buf.write(ti.tobuf(tarfile.USTAR_FORMAT) + body + b"\0" * (-len(body) % 512))
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime = len(data), 0
        buf.write(ti.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512))
    buf.write(b"\0" * 1024)
    buf.write(b"\0" * (-buf.tell() % 10240))
    return buf.getvalue()


@dataclass
class ShardSpec:
    samples: list[SampleSpec]
    corrupt: tuple | None = None  # ("truncate", fraction) | ("pax", sample index)

    def members(self) -> list[tuple[str, bytes]]:
        return [m for s in self.samples for m in sample_members(s)]

    def content(self) -> bytes:
        members = self.members()
        if self.corrupt and self.corrupt[0] == "pax":
            first = sum(len(sample_members(s)) for s in self.samples[: self.corrupt[1]])
            return tar_bytes(members, bad_pax_before=first)
        data = tar_bytes(members)
        if self.corrupt and self.corrupt[0] == "truncate":
            return data[: self.cut(data)]
        return data

    def cut(self, full: bytes) -> int:
        return int(len(tar_bytes(self.members()).rstrip(b"\0")) * self.corrupt[1])

    def required_keys(self) -> set[str]:
        """Keys that must be accounted for: all of them, or on a corrupt shard those wholly before the damage
        (the rest may be rejected, kept if readable, or missing)."""
        if not self.corrupt:
            return {s.key for s in self.samples}
        if self.corrupt[0] == "pax":
            return {s.key for s in self.samples[: self.corrupt[1]]}
        full = tar_bytes(self.members())
        cut, ends = self.cut(full), {}
        with tarfile.open(fileobj=io.BytesIO(full)) as tf:
            for ti in tf:
                key = ti.name.split(".", 1)[0]
                ends[key] = max(ends.get(key, 0), ti.offset_data + ti.size)
        return {k for k, end in ends.items() if end <= cut}


_kinds = st.sampled_from(["text", "text", "image1", "image1", "image2", "image2", "overlong", "bad"])


@st.composite
def shard_specs(draw, tag: str) -> ShardSpec:
    n = draw(st.integers(3, 8))
    samples = []
    for j in range(n):
        samples.append(SampleSpec(
            key=f"{tag}{j:02d}", kind=draw(_kinds), style=draw(st.sampled_from(["messages", "sharegpt"])),
            words=draw(st.integers(5, 400)), number="".join(map(str, draw(st.permutations(range(10)))[:4])),
            size=draw(st.integers(0, 3)), extra=draw(st.integers(0, 9)) == 0))
    return ShardSpec(samples)


# --- the independent oracle ----------------------------------------------------------------------------------

def key_of(name: str) -> str:
    """WebDataset rule: the key is the path up to the first dot of the basename."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return name if dot < 0 else name[:dot]


def read_tar(path: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every regular member Python's tarfile can read, in order, up to any damage."""
    out = []
    try:
        with tarfile.open(path, "r:") as tf:
            for ti in tf:
                if ti.isfile():
                    out.append((ti.name, tf.extractfile(ti).read()))
    except (tarfile.TarError, OSError, ValueError, EOFError):
        pass
    return out


def group(members: list[tuple[str, bytes]]) -> dict[str, dict[str, bytes]]:
    samples: dict[str, dict[str, bytes]] = {}
    for name, data in members:
        samples.setdefault(key_of(name), {})[name] = data
    return samples


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path, skip: set[str] = frozenset()) -> dict[str, str]:
    """sha256 of every file under root (index.sqlite by its rows: SQLite page layout is not the content)."""
    out = {}
    if not root.is_dir():
        return out
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel in skip:
            continue
        if p.name == "index.sqlite":
            with contextlib.closing(sqlite3.connect(f"file:{p}?mode=ro", uri=True)) as db:
                rows = [db.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()
                        for t in ("samples", "sample_parts")]
            out[rel] = sha(json.dumps(rows).encode())
        else:
            out[rel] = sha(p.read_bytes())
    return out


@dataclass
class Outcome:
    mode: str
    error: str | None = None  # the run raised (or its Dagster run failed): its message
    verdict: str | None = None  # PASS | FAIL | INCOMPLETE, from the run's own audit
    audit_detail: list = field(default_factory=list)
    full: bool = True  # a full (non-incremental) run: must equal a from-scratch run
    plan_config: PlanConfig | None = None


def verdict_of(result) -> tuple[str, list]:
    v = getattr(result, "verdict", None) or result.stats.get("verdict")
    if v:
        return str(v).upper(), result.violations[:5]
    return ("PASS" if result.ok else "FAIL"), result.violations[:5]


# --- the state machine ---------------------------------------------------------------------------------------

class Lifecycle(RuleBasedStateMachine):
    steps = 0  # over all examples: the CI budget is counted in steps
    runs: dict = {}
    # per test run (reset by the test and the soak): a killed run costs ~15 s here, `dagster asset materialize`
    # ~40 s per call, so CI kills twice and leaves the CLI to the soak
    subprocess_budget = {"kill": 2, "cli": 0}
    orchestrated_per_example = 2  # a Dagster run costs 3-5 s here, a core run ~1 s
    raise_on_violation: bool | set = True  # True: any violation fails; a set: only those (the soak's --minimize)
    log: list = []  # violations found (the soak script reads these)

    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="lifecycle-"))
        self.inp, self.work, self.out = self.root / "in", self.root / "work", self.root / "out"
        self.inp.mkdir()
        self.shards: dict[str, ShardSpec] = {}
        self.tags = 0
        self.max_len, self.algorithm = 1100, "bfd"
        self.user_files: dict[str, bytes] = {}
        self.instance: dg.DagsterInstance | None = None
        self.sensor_run_keys: set[str] = set()
        self.removed: set[str] = set()  # shards removed since the last run
        self.trace: list[str] = []
        self.orchestrated_left = self.orchestrated_per_example

    def teardown(self):
        if self.instance is not None:
            self.instance.dispose()
        shutil.rmtree(self.root, ignore_errors=True)

    def _step(self, what: str) -> None:
        type(self).steps += 1
        self.trace.append(what)
        with contextlib.suppress(InvalidArgument):  # outside a hypothesis test (the soak's helpers)
            note(what)

    def _tag(self) -> str:
        self.tags += 1
        return f"g{self.tags}k"

    def _write(self, name: str) -> None:
        path = self.inp / f"{name}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.new")  # never a half-written shard: the user copies, then renames
        tmp.write_bytes(self.shards[name].content())
        os.replace(tmp, path)

    # ---- rules: the user's input ----
    @initialize(data=st.data(), n=st.integers(2, 3))
    def start(self, data, n):
        for name in SHARD_NAMES[:n]:
            self.shards[name] = data.draw(shard_specs(self._tag()))
            self._write(name)
        self._step(f"start with {n} shards")

    @precondition(lambda self: len(self.shards) < 4)
    @rule(data=st.data())
    def add_shard(self, data):
        name = data.draw(st.sampled_from([n for n in SHARD_NAMES if n not in self.shards]))
        self.shards[name] = data.draw(shard_specs(self._tag()))
        self._write(name)
        self.removed.discard(name)
        self._step(f"add shard {name}")

    @precondition(lambda self: len(self.shards) > 1)
    @rule(data=st.data())
    def remove_shard(self, data):
        name = data.draw(st.sampled_from(sorted(self.shards)))
        del self.shards[name]
        (self.inp / f"{name}.tar").unlink()
        self.removed.add(name)
        self._step(f"remove shard {name}")

    @rule(data=st.data(), same_keys=st.booleans())
    def replace_shard(self, data, same_keys):
        name = data.draw(st.sampled_from(sorted(self.shards)))
        new = data.draw(shard_specs(self._tag()))
        if same_keys:  # new content under the old keys: the case where stale output would look plausible
            old = self.shards[name].samples
            for i, s in enumerate(new.samples):
                s.key = old[i].key if i < len(old) else s.key
        self.shards[name] = new
        self._write(name)
        self._step(f"replace shard {name} (same keys: {same_keys})")

    def _pick_sample(self, data, ok=lambda s: True) -> tuple[str, SampleSpec] | None:
        choices = [(n, s) for n, sh in sorted(self.shards.items()) if not sh.corrupt for s in sh.samples if ok(s)]
        return data.draw(st.sampled_from(choices)) if choices else None

    @rule(data=st.data(), what=st.sampled_from(["json same tokens", "json more tokens", "media same size",
                                                "media new size"]))
    def edit_sample(self, data, what):
        """Edit one sample in place: its JSON (one digit: same byte size and token count; or more words), or
        the bytes of its images (one byte flipped: same size; or a new size)."""
        media = what.startswith("media")
        picked = self._pick_sample(data, lambda s: s.kind in ("image1", "image2") if media else s.kind != "bad")
        if picked is None:
            return
        name, s = picked
        if what == "json same tokens":
            s.number = s.number[:-1] + str((int(s.number[-1]) + 1) % 10)
        elif what == "json more tokens":
            s.more += 7
        elif what == "media same size":
            s.flip = s.flip % 255 + 1
        else:
            s.size += 1
        self._write(name)
        self._step(f"edit {name}/{s.key}: {what}")

    @rule(data=st.data(), how=st.sampled_from(["truncate", "pax"]), where=st.integers(1, 9))
    def corrupt_shard(self, data, how, where):
        name = data.draw(st.sampled_from(sorted(self.shards)))
        sh = self.shards[name]
        sh.corrupt = ("truncate", where / 10) if how == "truncate" else ("pax", min(where, len(sh.samples) - 1))
        self._write(name)
        self._step(f"corrupt shard {name}: {sh.corrupt}")

    @rule(which=st.sampled_from(["my-notes.tar", "notes.txt", "mine/keep.bin"]))
    def user_file(self, which):
        body = (tar_bytes([("x00.json", b'{"caption": "mine"}')]) if which.endswith(".tar")
                else f"the user's own {which}\n".encode())
        path = self.out / which
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        self.user_files[which] = body
        self._step(f"user puts {which} in the output folder")

    @rule(max_len=st.sampled_from(MAX_LENS), algorithm=st.sampled_from(ALGORITHMS))
    def change_settings(self, max_len, algorithm):
        self.max_len, self.algorithm = max_len, algorithm
        self._step(f"settings: max_len {max_len}, algorithm {algorithm}")

    # ---- rules: runs ----
    def config(self, incremental: bool = False) -> PlanConfig:
        return PlanConfig(max_len=self.max_len, algorithm=self.algorithm, max_packs_per_shard=PACKS_PER_SHARD,
                          incremental=incremental)

    def pack_settings(self):
        from pack_assets.defs.resources import PackSettings

        return PackSettings(input_dir=str(self.inp), work_dir=str(self.work), output_dir=str(self.out),
                            max_len=self.max_len, algorithm=self.algorithm, max_packs_per_shard=PACKS_PER_SHARD,
                            write_workers=1)

    # two rules, not one with a flag: runs are where the invariants are checked, so they get a larger share
    @rule()
    def run_full(self):
        self._run("core full", lambda: core_run(self.inp, self.work, self.out, self.config()))

    @rule()
    def run_incremental(self):
        self._run("core incremental", lambda: core_run(self.inp, self.work, self.out, self.config(incremental=True)))

    @precondition(lambda self: self.orchestrated_left > 0)
    @rule(via=st.sampled_from(["sensor", "pipeline", "kill", "sensor", "kill", "cli"]),
          n=st.integers(0, len(KILL_POINTS) - 1))
    def run_orchestrated(self, via, n):
        self.orchestrated_left -= 1
        if via in ("kill", "cli"):
            budget = type(self).subprocess_budget
            if budget.get(via, 0) <= 0:  # subprocesses are slow: a few per test run, then in process instead
                via = "pipeline"
            else:
                budget[via] -= 1
        if via == "pipeline":
            self._run("dagster pipeline (pack-assets run)", self._pipeline)
        elif via == "sensor":
            self._run("sensor tick", self._sensor_tick)
        elif via == "kill":
            point = KILL_POINTS[n]
            self._run(f"kill at {point[0]}#{point[1]}, then rerun", lambda: self._kill_then_rerun(point))
        else:
            self._run("dagster asset materialize (subprocess)", self._dagster_cli)

    def _run(self, label: str, fn) -> None:
        self._step(f"run: {label}")
        inputs_before, t0 = tree(self.inp), time.perf_counter()
        with no_plots():
            outcome = fn()
            outcome.mode = label
            violations = self.check(outcome, inputs_before)
        n, seconds = type(self).runs.get(label, (0, 0.0))
        type(self).runs[label] = (n + 1, round(seconds + time.perf_counter() - t0, 1))
        self.removed.clear()
        if violations:
            type(self).log.append({"trace": list(self.trace), "violations": violations})
            wanted = self.raise_on_violation
            if wanted is True or (wanted and wanted & {x["invariant"] for x in violations}):
                raise AssertionError("invariants violated after `" + label + "`:\n" + "\n".join(
                    f"  [{v['invariant']}] {v['detail']}" for v in violations))

    @contextlib.contextmanager
    def _dagster_home(self):
        """One DAGSTER_HOME per example, shared by `pack-assets run`, the sensors and the CLI, as on a
        user's machine; set only while Dagster runs (other tests in the session must not see it). The instance
        is the one `pack-assets run` makes (orchestrate.instance_for: the project's dagster.yaml in a new home,
        and the command process's Dagster settings, runenv.prepare_dagster_process, which spare each stored
        event an fsync and a new SQLAlchemy engine; tests/test_dagster.py's runs use it too)."""
        from pack_assets.runner.orchestrate import instance_for

        home = self.root / "dagster_home"
        home.mkdir(exist_ok=True)
        saved = os.environ.get("DAGSTER_HOME")
        os.environ["DAGSTER_HOME"] = str(home)
        try:
            if self.instance is None:
                self.instance = instance_for(home)
            yield self.instance
        finally:
            os.environ.pop("DAGSTER_HOME") if saved is None else os.environ.__setitem__("DAGSTER_HOME", saved)

    def _pipeline(self) -> Outcome:
        from pack_assets.runner.orchestrate import run_pipeline

        try:
            with self._dagster_home() as instance:
                s = run_pipeline(self.pack_settings().to_settings(), instance, log=lambda m: None, jobs=1)
        except Exception as e:  # noqa: BLE001 - the oracle reports it
            return Outcome("", error=f"{type(e).__name__}: {e}", plan_config=self.config())
        verdict = str(s.get("verdict") or ("PASS" if s.get("violations") == 0 else "FAIL")).upper()
        return Outcome("", verdict=verdict, audit_detail=[f"{s.get('violations')} violation(s)"],
                       plan_config=self.config())

    def _sensor_tick(self) -> Outcome:
        """What the daemon does: evaluate new_shard_sensor, apply its partition requests, launch each run
        request whose run key is new; then evaluate replan_sensor and launch the pack run it asks for."""

        res = {"settings": self.pack_settings()}
        with self._dagster_home() as inst:
            return self._tick(inst, res)

    def _tick(self, inst, res) -> Outcome:
        from pack_assets.defs.assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
        from pack_assets.defs.sensors import new_shard_sensor, replan_sensor
        from pack_assets.runner.orchestrate import QUIET

        errors, verdict, detail, planned = [], None, [], False

        def requests(result):
            if isinstance(result, dg.SkipReason) or result is None:
                return [], []
            if isinstance(result, dg.RunRequest):
                return [result], []
            if isinstance(result, dg.SensorResult):
                return list(result.run_requests or []), list(result.dynamic_partitions_requests or [])
            return [r for r in result if isinstance(r, dg.RunRequest)], []

        def launch(rr) -> None:
            nonlocal verdict, detail, planned
            if rr.run_key is not None and rr.run_key in self.sensor_run_keys:
                return  # the daemon skips a run key it has seen
            self.sensor_run_keys.add(rr.run_key)
            if rr.partition_key is not None:
                r = dg.materialize([manifest, token_lengths], partition_key=rr.partition_key, instance=inst,
                                   resources=res, raise_on_error=False, run_config=QUIET)
            else:
                planned = True
                r = dg.materialize([pack_plan, packed_shards, audit_report], instance=inst, resources=res,
                                   raise_on_error=False, run_config=QUIET)
                checks = {c.check_name: c.passed for c in r.get_asset_check_evaluations()}
                if "nothing_lost" in checks:
                    verdict = "PASS" if checks["nothing_lost"] else "FAIL"
            if not r.success:
                errors.extend(f"{ev.step_key}: {(e.cause or e).message.strip()[:300]}"
                              for ev in r.all_events if ev.is_step_failure for e in [ev.step_failure_data.error])

        for sensor in (new_shard_sensor, replan_sensor):
            ctx = dg.build_sensor_context(instance=inst, resources=res)
            try:
                runs, parts = requests(sensor(ctx))
            except Exception as e:  # noqa: BLE001
                errors.append(f"{sensor.name}: {type(e).__name__}: {e}")
                continue
            for p in parts:
                if isinstance(p, dg.AddDynamicPartitionsRequest):
                    inst.add_dynamic_partitions(p.partitions_def_name, list(p.partition_keys))
                else:
                    for k in p.partition_keys:
                        inst.delete_dynamic_partition(p.partitions_def_name, k)
            for rr in runs:
                launch(rr)
        if verdict is None and not errors:  # no pack run this tick: the audit of what is there must hold
            if not (self.work / store.DB_NAME).exists():
                verdict, detail = "INCOMPLETE", ["nothing planned yet"]
            else:
              try:
                verdict, detail = verdict_of(run_audit(self.work, self.out))
              except Exception as e:  # noqa: BLE001
                errors.append(f"audit after the tick: {type(e).__name__}: {e}")
        return Outcome("", error="; ".join(errors) or None, verdict=verdict, audit_detail=detail,
                       plan_config=self.config() if planned else self._last_plan_config())

    def _last_plan_config(self) -> PlanConfig | None:
        try:
            with store.connect(self.work, read_only=True) as con:
                cfg = PlanInfo.load(con).config
            return PlanConfig(**cfg)
        except Exception:  # noqa: BLE001
            return None

    def _kill_then_rerun(self, point) -> Outcome:
        cfg = json.dumps({"max_len": self.max_len, "algorithm": self.algorithm, "max_packs_per_shard": PACKS_PER_SHARD})
        subprocess.run([sys.executable, str(HARNESS), str(self.inp), str(self.work), str(self.out), cfg,
                        point[0], str(point[1])], capture_output=True, timeout=300, env=_env())
        return core_run(self.inp, self.work, self.out, self.config())

    def _dagster_cli(self) -> Outcome:
        run_config = json.dumps({"resources": {"settings": {"config": {
            k: v for k, v in self.pack_settings().model_dump().items()}}}})
        dagster = str(Path(sys.executable).parent / "dagster")
        with self._dagster_home() as inst:  # new shards registered as `pack-assets run` does
            known = set(inst.get_dynamic_partitions("source_shards"))
            current = list(store.find_shards(self.inp))
            inst.add_dynamic_partitions("source_shards", [k for k in current if k not in known])
            env = _env(DAGSTER_HOME=os.environ["DAGSTER_HOME"])
        base = [dagster, "asset", "materialize", "-m", "pack_assets.definitions", "--config-json", run_config]
        todo = [k for k in current if manifest_is_current(self.inp, self.work, k) is None
                or not token_lengths_are_current(self.work, k, PROFILE)]
        for k in todo:
            p = subprocess.run(base + ["--select", "manifest,token_lengths", "--partition", k], env=env,
                               capture_output=True, text=True, timeout=600)
            if p.returncode:
                return Outcome("", error=f"manifest,token_lengths {k}: exit {p.returncode}: {p.stderr[-600:]}",
                               plan_config=self.config())
        p = subprocess.run(base + ["--select", "pack_plan,packed_shards,audit_report"], env=env, capture_output=True,
                           text=True, timeout=600)
        if p.returncode:
            return Outcome("", error=f"pack_plan,packed_shards,audit_report: exit {p.returncode}: {p.stderr[-600:]}",
                           plan_config=self.config())
        verdict, detail = verdict_of(run_audit(self.work, self.out))
        return Outcome("", verdict=verdict, audit_detail=detail, plan_config=self.config())

    # ---- the oracle ----
    def check(self, outcome: Outcome, inputs_before: dict) -> list[dict]:
        v: list[dict] = []

        def bad(invariant: str, detail: str) -> None:
            v.append({"invariant": invariant, "detail": detail})

        # files the tool did not write: the user's and the source shards
        for rel, body in self.user_files.items():
            p = self.out / rel
            if not p.is_file():
                bad("user_file_untouched", f"{rel} in the output folder was deleted")
            elif p.read_bytes() != body:
                bad("user_file_untouched", f"{rel} in the output folder was overwritten")
        if tree(self.inp) != inputs_before:
            bad("user_file_untouched", "a source shard changed during the run")
        if outcome.error is not None:
            bad("run_finishes", outcome.error[:600])
            if outcome.verdict is None:
                return v
            # a sensor tick whose shard run failed may still have planned, written and audited the rest

        source = {name: group(read_tar(self.inp / f"{name}.tar")) for name in self.shards}
        required = {f"{n}/{k}" for n, sh in self.shards.items() for k in sh.required_keys()}
        known = {f"{n}/{k}": members for n, samples in source.items() for k, members in samples.items()}
        optional = {sid for sid in known if sid not in required} | {
            f"{n}/{s.key}" for n, sh in self.shards.items() for s in sh.samples if f"{n}/{s.key}" not in required}

        # the catalog: packed (pack_members), dropped, rejected (samples.status)
        try:
            with store.connect(self.work, read_only=True) as con:
                q = lambda sql: [r[0] for r in con.execute(sql).fetchall()]  # noqa: E731
                in_packs, dropped = q("SELECT sample_id FROM pack_members"), q("SELECT sample_id FROM dropped")
                rejected = q("SELECT sample_id FROM samples WHERE status = 'rejected'")
                reason_rows = con.execute("SELECT shard, key, reason, detail FROM rejected").fetchall()
        except Exception as e:  # noqa: BLE001
            bad("every_sample_once", f"the catalog cannot be read: {type(e).__name__}: {e}")
            return v

        # the output, read back with tarfile
        packed_out, problems = self._read_output(known, reason_rows)
        for p in problems:
            bad(*p)
        count = {}
        for table, ids in (("packed", in_packs), ("dropped", dropped), ("rejected", rejected)):
            for sid in ids:
                count.setdefault(sid, []).append(table)
        for sid in sorted(set(packed_out) | set(in_packs)):
            if packed_out.get(sid, 0) != in_packs.count(sid):
                bad("every_sample_once", f"{sid}: in {in_packs.count(sid)} planned pack(s) but "
                    f"{packed_out.get(sid, 0)} time(s) in the output")
        for sid in sorted(required):
            if len(count.get(sid, [])) != 1:
                bad("every_sample_once", f"{sid}: {count.get(sid) or 'in no table'} (expected exactly one of packed, "
                    "dropped, rejected)")
        for sid in sorted(optional):
            if len(count.get(sid, [])) > 1:
                bad("every_sample_once", f"{sid} (after damage): {count[sid]}")
        for sid in sorted(set(count) | set(packed_out)):
            base = sid.split("#", 1)[0]
            if base not in known and base not in optional:
                shard = base.rsplit("/", 1)[0]
                what = "a removed shard" if shard not in self.shards else "no current source sample"
                bad("no_stale_sample", f"{sid} ({count.get(sid) or 'in the output'}) is from {what}")

        # the audit verdict must be true, and a run must leave a state that passes it
        clean = not [x for x in v if x["invariant"] in ("every_sample_once", "no_stale_sample", "bytes_equal_source",
                                                        "member_carried")]
        if outcome.verdict == "PASS" and not clean:
            bad("audit_truthful", "the audit says PASS, yet the oracle found the violations above")
        if outcome.verdict != "PASS" and outcome.error is None:
            bad("audit_passes", f"the run's audit verdict is {outcome.verdict}: {outcome.audit_detail}")

        # a full run equals a from-scratch run on the same input and settings
        if outcome.full and "incremental" not in outcome.mode and outcome.plan_config is not None:
            self._compare_with_scratch(outcome.plan_config, bad)
        return v

    def _read_output(self, known: dict, reason_rows: list) -> tuple[dict, list]:
        """Packed sample ids (with multiplicity) found in the output shards, and byte problems."""
        packed, problems = {}, []
        for path in sorted(self.out.glob("*.tar")):
            if path.name in self.user_files:
                continue
            for pack_key, parts in group(read_tar(path)).items():
                doc_bytes = parts.get(f"{pack_key}.json")
                if doc_bytes is None:
                    problems.append(("bytes_equal_source", f"{path.name}: pack {pack_key} has no JSON"))
                    continue
                doc = json.loads(doc_bytes)
                metas = doc.get("_meta", {}).get("sources", [])
                carried = {sha(b) for b in parts.values()}
                for i, sub in enumerate(doc.get("samples", [])):
                    sid = sub["sample_id"]
                    packed[sid] = packed.get(sid, 0) + 1
                    src = known.get(sid)
                    if src is None:
                        continue  # reported as a stale sample
                    json_name = next((n for n in src if n.endswith(".json")), None)
                    if json_name is not None:
                        try:
                            current = json.loads(src[json_name])
                        except ValueError:
                            current = "<invalid JSON>"
                        if sub.get("source") != current:
                            problems.append(("bytes_equal_source", f"{sid}: the packed conversation is not the current "
                                             f"source JSON ({path.name}, pack {pack_key})"))
                    meta = metas[i] if i < len(metas) else {}
                    for m in meta.get("media", []):
                        out_bytes = parts.get(m["output_name"])
                        if out_bytes is None or src.get(m["name"]) != out_bytes:
                            problems.append(("bytes_equal_source", f"{sid}: output {m['output_name']} differs from the "
                                             f"current source member {m['name']}"))
                    named = {json_name} | {m["name"] for m in meta.get("media", [])}
                    for name, data in src.items():
                        if (name in named or sha(data) in carried
                                or data.decode("utf-8", "replace") in doc_bytes.decode()):
                            continue
                        shard, key = sid.rsplit("/", 1)
                        if not any(r[0] == shard and r[1] == key and name in (r[3] or "") for r in reason_rows):
                            problems.append(("member_carried", f"{sid}: member {name} is neither in the output nor "
                                             "in a reason row"))
        return packed, problems

    def _compare_with_scratch(self, cfg: PlanConfig, bad) -> None:
        key = (json.dumps(tree(self.inp), sort_keys=True), cfg)
        if key not in _SCRATCH:
            d = Path(tempfile.mkdtemp(prefix="scratch-", dir=self.root))
            res = core_run(self.inp, d / "work", d / "out", replace(cfg, incremental=False), audit=False)
            if res.error:
                _SCRATCH[key] = None  # the from-scratch run fails itself: reported by the invariants above
            else:
                _SCRATCH[key] = (tree(d / "out"), (d / "work" / "pack_plan.jsonl").read_bytes())
            shutil.rmtree(d, ignore_errors=True)
        expected = _SCRATCH[key]
        if expected is None:
            return
        got = tree(self.out, skip=set(self.user_files))
        if got != expected[0]:
            diff = sorted(set(got) ^ set(expected[0]))
            diff += sorted(k for k in set(got) & set(expected[0]) if got[k] != expected[0][k])
            bad("same_as_from_scratch", f"output files differ from a from-scratch run: {diff[:6]}")
        plan = self.work / "pack_plan.jsonl"
        if not plan.exists() or plan.read_bytes() != expected[1]:
            bad("same_as_from_scratch", "pack_plan.jsonl differs from a from-scratch run")


_SCRATCH: dict = {}


def _env(**extra) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def core_run(inp: Path, work: Path, out: Path, config: PlanConfig, audit: bool = True) -> Outcome:
    """The five stage functions as `pack-assets run` chains them, without Dagster."""
    try:
        shards = list(store.find_shards(inp))
        for s in shards:
            run_manifest(inp, work, s)
            run_token_lengths(work, s, PROFILE)
        summary = run_plan(work, shards, config, PROFILE)
        run_write(work, inp, out, workers=1)
        # no token recount: it re-tokenizes a sample (0.2 s a run here) and day two does not change counting
        verdict, detail = verdict_of(run_audit(work, out, recount_fraction=0)) if audit else (None, [])
    except Exception as e:  # noqa: BLE001 - the oracle reports it
        return Outcome("", error=f"{type(e).__name__}: {e}", plan_config=config, full=not config.incremental)
    if summary.violations:
        detail = [f"plan check: {summary.violations}"] + detail
    return Outcome("", verdict=verdict, audit_detail=detail, plan_config=config, full=not config.incremental)


# --- the test --------------------------------------------------------------------------------------------------

STEPS_PER_EXAMPLE = 20
EXAMPLES = 6  # 6 x 20 = 120 steps per commit (within the suite's 10 minutes); a new seed per commit adds them up
SEED_VARIABLE = "PACK_ASSETS_LIFECYCLE_SEED"


def lifecycle_seed(checkout: Path = HERE) -> int:
    """A new draw per commit, so every commit's CI explores other histories than the last one did: the seed is
    the checked-out commit's hash (``$PACK_ASSETS_LIFECYCLE_SEED`` replays any seed; outside git, a random one).
    The test prints it either way, so a failure in CI replays locally."""
    if os.environ.get(SEED_VARIABLE):
        return int(os.environ[SEED_VARIABLE])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return int(head.stdout[:12], 16) if head.returncode == 0 else int.from_bytes(os.urandom(6), "big")


def test_lifecycle_seed_is_stable_per_commit_new_on_the_next_and_replayable(tmp_path, monkeypatch):
    """What CI relies on: rerunning one commit explores the same histories, the next commit other ones, and
    the printed seed replays a failure; outside a checkout each run draws anew."""
    monkeypatch.delenv(SEED_VARIABLE, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "one")
    first = lifecycle_seed(repo)
    assert lifecycle_seed(repo) == first
    git("commit", "-q", "--allow-empty", "-m", "two")
    second = lifecycle_seed(repo)
    assert second != first and lifecycle_seed(repo) == second
    monkeypatch.setenv(SEED_VARIABLE, str(first))
    assert lifecycle_seed(repo) == first  # the failing commit's seed, replayed on any checkout
    monkeypatch.delenv(SEED_VARIABLE)
    outside = tmp_path / "not-a-checkout"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert lifecycle_seed(outside) != lifecycle_seed(outside)


def test_day_two_lifecycle():
    Lifecycle.steps, Lifecycle.runs, Lifecycle.log = 0, {}, []
    Lifecycle.subprocess_budget = {"kill": 2, "cli": 0}
    Lifecycle.orchestrated_per_example, Lifecycle.raise_on_violation = 2, True
    _SCRATCH.clear()
    drawn = lifecycle_seed()
    print(f"\nlifecycle seed {drawn} (replay: {SEED_VARIABLE}={drawn})")
    t0 = time.perf_counter()
    run_state_machine_as_test(seed(drawn)(Lifecycle), settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))
    print(f"\n{Lifecycle.steps} steps, runs {Lifecycle.runs}, {time.perf_counter() - t0:.1f} s")
    assert Lifecycle.steps >= EXAMPLES * STEPS_PER_EXAMPLE * 3 // 4  # hypothesis ends some examples early
