"""Every printed summary and summary.json name the compute model that produced the times, and for the roofline
that it has not been validated for this GPU and engine (issue 36, item 11)."""
from __future__ import annotations

import json

from analysis.results import ROOFLINE_CAVEAT, compute_model_entry, compute_model_text
from cli import main


def test_the_roofline_carries_its_caveat_and_a_fit_does_not():
    caveat = ROOFLINE_CAVEAT.format(gpu="h100")
    assert compute_model_text("roofline (built-in defaults)", "h100") == f"roofline (built-in defaults); {caveat}"
    fitted = "in-loop (compute_in_loop of profiles/h200.json)"
    assert compute_model_text(fitted, "h200") == fitted
    assert compute_model_entry({"gpu": "h200"}) == {}           # a config that does not record it: no key


def test_simulate_prints_and_records_the_compute_model(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--num-requests", "10", "--gpu", "h100", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    expected = f"roofline (built-in defaults); {ROOFLINE_CAVEAT.format(gpu='h100')}"
    assert summary["compute_model"] == expected and f"compute model: {expected}" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["compute_model"] == "roofline (built-in defaults)"      # the existing key is unchanged


def test_a_profile_names_its_section_and_compare_prints_it(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--policy", "vattention", "--policy", "paged", "--num-requests", "10", "--workers", "1",
                 "--profile", "profiles/h200.json", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "compute model: in-loop (compute_in_loop of profiles/h200.json)" in printed
    assert "not validated" not in printed


def test_profile_help_says_it_replaces_the_compute_model(capsys):
    import pytest
    for command in ("simulate", "compare", "capacity", "sweep", "validate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "replaces the compute model" in text, command
