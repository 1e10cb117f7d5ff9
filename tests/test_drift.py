"""The guard against drift (issue 36, item 5): a changed environment is a different profile, and `pack-assets
count --check N` recounts with the real transformers processor, naming every sample that differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import image_bytes, needs
from thinking_fixtures import thinking_folder

try:
    import torchvision  # noqa: F401
    NO_TORCHVISION = False
except ImportError:
    NO_TORCHVISION = True
processor_needed = needs(NO_TORCHVISION, "torchvision is not installed (the processor extra): no Qwen3-VL processor")


def test_the_fingerprint_follows_the_versions_of_the_packages_that_count(monkeypatch):
    """An upgrade of a package the fast rule runs (the template's jinja2, the tokenizers) is a new profile,
    counted again; transformers, which the fast rule never runs, is not."""
    from importlib import metadata

    from pack_assets.core.counting import environment
    from pack_assets.core.counting.profiles import load_profile

    profile = load_profile("qwen3-vl")
    before = profile.fingerprint
    installed = metadata.version
    try:
        for package, moves in (("jinja2", True), ("tokenizers", True), ("tiktoken", True), ("transformers", False)):
            monkeypatch.setattr(metadata, "version", lambda name, p=package: "99.0" if name == p else installed(name))
            environment.versions.cache_clear()  # a new process
            assert (profile.fingerprint != before) is moves, package
    finally:
        environment.versions.cache_clear()


def _fresh() -> None:
    """Each process builds its processor once: a test that changes the build stands for a new process."""
    from pack_assets.core.counting import environment, procount

    environment.processor_settings.cache_clear()
    procount.load_processor.cache_clear()


def _drift(monkeypatch) -> None:
    """From now on the processor caps images at 1024x1024 pixels, which the folder's files do not say."""
    from pack_assets.core.counting import environment

    build = environment.build_processor.__wrapped__

    def drifted(model_dir, trust_remote_code=False):
        proc = build(model_dir, trust_remote_code)
        proc.image_processor.size = {"shortest_edge": 65536, "longest_edge": 1024 * 1024}
        return proc

    monkeypatch.setattr(environment, "build_processor", drifted)
    _fresh()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return thinking_folder(tmp_path_factory.getbasetemp(), "qwen3-vl-thinking")


@pytest.fixture
def records(tmp_path) -> Path:
    (tmp_path / "big.png").write_bytes(image_bytes(1600, 1200, "PNG"))
    (tmp_path / "small.png").write_bytes(image_bytes(320, 200, "PNG"))
    recs = [{"id": "text", "messages": [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "reasoning_content": "greet", "content": "Hello"}]},
            {"id": "small", "messages": [{"role": "user", "content": [{"type": "image", "image": "small.png"},
                                                                        {"type": "text", "text": "?"}]},
                                         {"role": "assistant", "content": "<think>look</think>A box."}]},
            {"id": "big", "messages": [{"role": "user", "content": [{"type": "image", "image": "big.png"},
                                                                      {"type": "text", "text": "?"}]},
                                       {"role": "assistant", "content": "A big box."}]}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return tmp_path / "r.jsonl"


@processor_needed
def test_count_check_recounts_with_the_real_processor(folder, records, capsys):
    from pack_assets.cli import main

    assert main(["count", "--input", str(records), "--model-dir", str(folder), "--check", "10"]) == 0
    err = capsys.readouterr().err
    assert "check: 3 sample(s) recounted with Qwen3VLProcessor: none differ" in err


@processor_needed
def test_a_processor_default_that_moved_is_a_failure_naming_the_sample(folder, records, capsys, monkeypatch):
    """As when an upgrade changes a processor default (transformers#48062 changed Qwen3-VL's per-frame pixel cap):
    the processor here caps images at 1024x1024 pixels, the folder's files do not say so; the fast rule follows
    the files. The check names the one sample over the cap and exits 1; the processor rule's fingerprint moves."""
    from pack_assets.cli import main
    from pack_assets.core.counting.profiles import processor_profile

    _fresh()
    before = processor_profile(folder).fingerprint
    _drift(monkeypatch)
    try:
        assert processor_profile(folder).fingerprint != before
        assert main(["count", "--input", str(records), "--model-dir", str(folder), "--check", "3"]) == 1
    finally:
        _fresh()
    err = capsys.readouterr().err
    assert "check FAILED big: counted" in err and "small" not in err.replace("check: ", "")
    assert "1 differ" in err


def test_check_needs_a_checkpoint_folder(records, capsys):
    from pack_assets.cli import main

    assert main(["count", "--input", str(records), "--check", "2"]) == 2
    assert "--check recounts with the model's processor" in capsys.readouterr().err


@processor_needed
def test_the_audit_step_recounts_samples_per_shard_with_the_processor(folder, tmp_path, monkeypatch):
    """Setting check_samples: the audit recounts that many samples per shard with the real processor; a
    processor whose default moved gives a processor_mismatch violation naming the sample."""
    from conftest import write_tar

    from pack_assets.core.audit import run_audit
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import run_plan
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.settings import Settings
    from pack_assets.core.write import run_write

    def rec(q):
        return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
                             {"role": "assistant", "reasoning_content": "look", "content": "A box."}]}

    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    for shard in ("a", "b"):
        write_tar(inp / f"{shard}.tar", [("k1.json", json.dumps(rec("big?"))),
                                         ("k1.png", image_bytes(1600, 1200, "PNG")),
                                         ("k2.json", json.dumps(rec("small?"))),
                                         ("k2.png", image_bytes(64, 48, "PNG"))])
    s = Settings(input_dir=str(inp), work_dir=str(work), output_dir=str(out), model_dir=str(folder))
    profile = s.model_profile()
    for shard in ("a", "b"):
        run_manifest(inp, work, shard)
        run_token_lengths(work, shard, profile)
    run_plan(work, ["a", "b"], s.plan, profile)
    run_write(work, inp, out, workers=1)
    result = run_audit(work, out, check_samples=2)
    assert result.ok and result.stats["processor_checked"] == 4
    _drift(monkeypatch)
    try:
        result = run_audit(work, out, check_samples=1)
    finally:
        _fresh()
    assert [v["sample_id"] for v in result.violations if v["check"] == "processor_mismatch"] == ["a/k1", "b/k1"]
    gone = folder.with_name(folder.name + "-gone")
    folder.rename(gone)  # the --model-dir folder moved away after the plan: a FAIL that says so, no traceback
    try:
        result = run_audit(work, out, check_samples=1)
    finally:
        gone.rename(folder)
    unavailable = [v["detail"] for v in result.violations if v["check"] == "processor_check_unavailable"]
    assert result.verdict == "FAIL" and unavailable and "is not a directory" in unavailable[0]


def test_a_run_asking_check_samples_without_a_processor_is_refused_before_it_starts(records, tmp_path, capsys,
                                                                                     monkeypatch):
    """--check-samples needs a checkpoint folder's processor: a built-in profile is refused in one line, exit 2,
    before the work folder is locked or anything is scanned (not an audit FAIL after the whole run)."""
    from conftest import write_tar

    from pack_assets.cli import main
    from pack_assets.runner import command

    monkeypatch.setattr(command, "run", lambda *a, **k: pytest.fail("the run started"))
    write_tar(tmp_path / "in" / "a.tar", [("k.json", json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}))])
    code = main(["run", "--input", str(tmp_path / "in"), "--max-len", "512", "--work", str(tmp_path / "w"), "--output",
                 str(tmp_path / "o"), "--dagster-home", str(tmp_path / "dh"), "--check-samples", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--check-samples recounts with the model's processor" in err
    assert not (tmp_path / "w").exists()
