"""One settings type: the CLI, a --config file, the Dagster resource and worker processes all carry the same
flat names, with one set of defaults."""

import json

import pytest

from pack_assets.cli import main
from pack_assets.core.plan import PlanConfig
from pack_assets.core.scan import ScanOptions
from pack_assets.core.settings import DEFAULTS, Settings, env_overrides
from pack_assets.defs.resources import PackSettings


def test_the_resource_has_exactly_the_settings_fields_and_their_defaults():
    resource = PackSettings()
    assert set(PackSettings.model_fields) == set(DEFAULTS)
    assert {name: getattr(resource, name) for name in DEFAULTS} == DEFAULTS
    assert resource.to_settings() == Settings()


def test_flat_settings_route_to_their_option_type_and_round_trip():
    s = Settings.from_flat({"input_dir": "in", "max_len": 4096, "hash_members": False, "incremental": True})
    assert s.plan == PlanConfig(max_len=4096, incremental=True) and s.scan == ScanOptions(hash_members=False)
    assert Settings.from_flat(s.flat()) == s == PackSettings.of(s).to_settings()


def test_an_unknown_or_invalid_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown setting 'max_length'.*max_len"):
        Settings.from_flat({"max_length": 4096})
    with pytest.raises(ValueError, match="audit scope"):
        Settings.from_flat({"audit_scope": "some"})
    with pytest.raises(ValueError, match="max_len must be positive"):
        Settings.from_flat({"max_len": 0})


def test_environment_variables_set_only_the_deployment_defaults():
    got = env_overrides({"PACK_ASSETS_INPUT": "/data", "PACK_ASSETS_MAX_LEN": "2048", "PACK_ASSETS_PROFILE": "",
                         "UNRELATED": "x"})
    assert got == {"input_dir": "/data", "max_len": 2048}


def test_a_config_file_with_a_typo_exits_2_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"max_samples_per_pak": 8}))
    code = main(["run", "--input", str(tmp_path / "in"), "--max-len", "1024", "--config", str(cfg),
                 "--work", str(tmp_path / "work"), "--output", str(tmp_path / "out")])
    assert code == 2 and "unknown setting 'max_samples_per_pak'" in capsys.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_chat_template_kwargs_from_every_source_is_one_canonical_setting_and_part_of_the_profile(tmp_path):
    """A mapping (--config, recipe) or JSON text (CLI flag, Launchpad) gives the same setting; it changes the
    profile's fingerprint (so counts made without it are redone) and reaches the template."""
    from pack_assets.core.recipe import load

    a = Settings.from_flat({"chat_template_kwargs": {"preserve_thinking": True, "enable_thinking": False}})
    b = Settings.from_flat({"chat_template_kwargs": '{"enable_thinking": false, "preserve_thinking": true}'})
    assert a == b and a.chat_template_kwargs == '{"enable_thinking":false,"preserve_thinking":true}'
    assert PackSettings.of(a).to_settings() == a
    (tmp_path / "in").mkdir()
    (tmp_path / "r.yaml").write_text("datasets: [{name: d, input: in}]\n"
                                     "chat_template_kwargs: {enable_thinking: false}\n")
    assert load(tmp_path / "r.yaml").flat()["chat_template_kwargs"] == {"enable_thinking": False}
    assert Settings.from_flat({"recipe": str(tmp_path / "r.yaml")}).chat_template_kwargs == '{"enable_thinking":false}'
    plain, kw = Settings().model_profile(), a.model_profile()
    assert plain.fingerprint != kw.fingerprint
    assert kw.template_kwargs == {"enable_thinking": False, "preserve_thinking": True}
    assert Settings.from_flat({"chat_template_kwargs": "{}"}).model_profile().fingerprint == plain.fingerprint
    for bad, why in (("[1]", "JSON object"), ("{x", "not JSON"), ('{"tools": []}', "apply_chat_template's own")):
        with pytest.raises(ValueError, match=why):
            Settings.from_flat({"chat_template_kwargs": bad})
