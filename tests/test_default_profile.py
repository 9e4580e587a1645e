"""The catalogue's default profile per GPU (issue 30 item 2) and the engine split-KV rule of the block model."""
from __future__ import annotations

from pathlib import Path

import pytest

import sim.setup.catalog as catalog
from sim.setup.catalog import CatalogError, default_profile
from sim.timing.compute import ENGINE_MAX_DECODE_SPLITS, engine_decode_splits
from sim.setup.config import SimConfig
from sim.core.runner import effective_profile


def test_roofline_and_none_force_the_builtin_models_and_a_path_is_kept():
    config = SimConfig(gpu="a100")
    assert effective_profile(config, "roofline") is None
    assert effective_profile(config, "NONE") is None
    assert effective_profile(config, "profiles/h200.json") == "profiles/h200.json"


def test_a_gpu_without_default_profile_uses_the_roofline():
    assert default_profile("a100") is None
    assert effective_profile(SimConfig(gpu="a100"), None) is None


def test_a_catalogue_default_is_used_when_no_profile_is_given(monkeypatch):
    entries = {"gpus": {"h200": {**catalog._catalog()["gpus"]["h200"], "default_profile": "h200-cross-workload.json"}},
               "models": catalog._catalog()["models"]}
    monkeypatch.setattr(catalog, "_catalog", lambda: entries)
    path = default_profile("h200")
    assert path is not None and path.endswith("profiles/h200-cross-workload.json")
    assert effective_profile(SimConfig(gpu="h200"), None) == path
    assert effective_profile(SimConfig(gpu="h200"), "roofline") is None
    assert catalog.get_gpu("h200").name == "h200"   # the key is not a GPUSpec field


def test_a_default_profile_naming_no_file_is_refused(monkeypatch):
    entries = {"gpus": {"h200": {"default_profile": "no-such-profile.json"}}, "models": {}}
    monkeypatch.setattr(catalog, "_catalog", lambda: entries)
    with pytest.raises(CatalogError, match="no-such-profile.json"):
        default_profile("h200")


@pytest.mark.parametrize("decodes", [1, 2, 3, 7, 8, 16, 33, 64, 65, 128, 256])
def test_engine_split_rule_matches_the_replay_kernel(decodes):
    engine = pytest.importorskip("hwbackend.replay.engine")
    expected = engine.decode_splits(decodes, 8, 132)
    assert engine_decode_splits(decodes, 8, engine.PROGRAMS_PER_SM * 132) == expected
    assert float(engine_decode_splits([decodes], 8, 528.0)[0]) == expected
    assert ENGINE_MAX_DECODE_SPLITS == engine.MAX_DECODE_SPLITS


def test_engine_split_rule_by_hand():
    # 1 decode x 8 KV heads: ceil(528 / 8) = 66 -> capped at 64; 64 decodes: ceil(528 / 512) = 2; 256: 1
    assert engine_decode_splits(1, 8, 528.0) == 64
    assert engine_decode_splits(64, 8, 528.0) == 2
    assert engine_decode_splits(256, 8, 528.0) == 1


@pytest.mark.parametrize("keyword", ["roofline", "None"])
def test_every_command_takes_the_profile_keywords(tmp_path, capsys, keyword):
    """README: ``--profile roofline`` (or ``none``) forces the roofline: simulate, compare, capacity and validate
    accept it (the pre-checks read no file of that name) and record the roofline."""
    import json

    from cli import main

    assert main(["simulate", "--num-requests", "20", "--profile", keyword, "--out", str(tmp_path / "s"),
                 "--quiet"]) == 0
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["compute_model"].startswith("roofline (built-in defaults")
    assert main(["compare", "--num-requests", "20", "--policy", "paged", "--policy", "vattention", "--profile", keyword,
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert main(["capacity", "--num-requests", "40", "--profile", keyword, "--slo", "ttft_p99=2s"]) == 0
    assert "compute model: roofline (built-in defaults" in capsys.readouterr().out
    run = Path(__file__).resolve().parents[1] / "docs" / "validation" / "colocate" / "static"
    assert main(["validate", "--hw-run", str(run), "--profile", keyword]) == 0
