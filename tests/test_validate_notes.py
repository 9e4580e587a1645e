"""kvsim validate's note when the hardware run's replay compute and the profile's in-loop fit differ."""
from pathlib import Path

from hwbackend.calibration.validate import replay_compute_note

ROOT = Path(__file__).resolve().parents[1]


def test_a_harness_run_against_an_engine_fit_is_noted_and_matching_ones_are_not():
    """docs/validation/hw-sync is a harness replay (its config has no ``compute``: harness); the H200's default
    profile (profiles/h200-engine.json) was fitted on engine replays: the TTFT errors (-84% at p50) measured the
    harness against the engine, and nothing said so. profiles/h200.json was fitted on harness replays: no note;
    an engine run against the engine fit: none either; an engine run against the harness fit: noted."""
    harness_run = {"gpu": "h200"}
    note = replay_compute_note(harness_run, None)
    assert note.startswith("kvsim: note: the hardware run timed its compute on the harness and ")
    assert "h200-engine.json's in-loop fit was made on engine replays" in note and "profiles/h200.json" in note
    assert replay_compute_note(harness_run, str(ROOT / "profiles" / "h200.json")) is None
    engine_run = {"gpu": "h200", "compute": "engine"}
    assert replay_compute_note(engine_run, None) is None
    assert "made on harness replays" in replay_compute_note(engine_run, str(ROOT / "profiles" / "h200.json"))
    assert replay_compute_note(harness_run, "roofline") is None          # no in-loop fit: nothing to compare
