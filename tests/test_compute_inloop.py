"""In-loop compute calibration (``hwbackend/calibration/inloop.py``, ``kvsim calibrate --from-run``) and the
compute model's graphed-decode terms (``sim/timing/compute.py``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hwbackend.calibration.inloop import (InLoopError, calibrate_from_runs, fit_compute, fit_decode_correction,
                                      growth_in_loop, load_rows)
from sim.timing.compute import BatchShape, RooflineComputeModel, decode_batch
from sim.setup.config import SimConfig

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "validation" / "graphs-x1.5"  # second session's replays (train-sync: no longest context)
SAME_START = ROOT / "docs" / "validation" / "same-start"  # the committed fit's training runs, one machine start
TRAIN = SAME_START / "train-a-sync"
TRAIN_X2 = SAME_START / "train-b-x2-sync"
TRAIN_X2B = SAME_START / "train-c-x2-sync"
PROFILE = ROOT / "profiles" / "h200.json"
CONFIG = SimConfig()
BASE = RooflineComputeModel(CONFIG.model_spec, CONFIG.gpu_spec)
GRAPHED = BASE.with_overrides({"decode_graphs": 1, "decode_overhead_us": 2000, "launch_floor_us": 9000,
                               "overhead_us": 3000, "decode_batch_knots": [1, 32, 64],
                               "decode_batch_correction_us": [0, 800, 1600]})


# ---- the compute model -------------------------------------------------------------------------------------
def test_graphed_decode_has_no_launch_floor_and_its_own_overhead():
    shape = decode_batch(8, 1000)
    roofline = BASE.with_overrides({"overhead_us": 0}).iteration_us(shape)
    # batch 8 on the knots (1, 0 us) - (32, 800 us): 7/31 of the way
    assert GRAPHED.iteration_us(shape) == pytest.approx(roofline + 2000 + 800 * 7 / 31)
    eager = GRAPHED.with_overrides({"decode_graphs": 0})
    assert eager.iteration_us(shape) == pytest.approx(max(9000, roofline + 3000))


def test_mixed_batches_stay_eager_with_graphs():
    mixed = BatchShape(new_tokens=8 + 512, attention_pairs=8 * 1001 + 512 * 256.5, kv_read_tokens=8000,
                       logit_sequences=9)
    assert GRAPHED.iteration_us(mixed) == GRAPHED.with_overrides({"decode_graphs": 0}).iteration_us(mixed)
    assert GRAPHED.iteration_us(mixed) >= 9000


@pytest.mark.parametrize("model", [BASE, GRAPHED, GRAPHED.with_overrides({"mixed_tile_rows": 64})])
def test_array_and_decode_run_forms_agree_with_iteration_us(model):
    shapes = [decode_batch(b, c) for b, c in ((1, 10), (8, 1000), (40, 3000), (64, 500))]
    shapes.append(BatchShape(new_tokens=2048, attention_pairs=2048 * 1024.5, kv_read_tokens=0, logit_sequences=1))
    shapes.append(BatchShape(new_tokens=0, attention_pairs=0, kv_read_tokens=0, logit_sequences=0))
    arrays = [np.array([getattr(s, f) for s in shapes], dtype=float) for f in
              ("new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences")]
    assert model.iteration_us_array(*arrays) == pytest.approx([model.iteration_us(s) for s in shapes])
    # a run of 5 decode steps of 16 sequences at 700 cached tokens = 5 single iterations, each one token longer
    run = model.decode_run_us(16, 16 * 700, 16 * 701, 5)
    assert run == pytest.approx([model.iteration_us(decode_batch(16, 700 + i)) for i in range(5)])


def test_correction_tables_are_checked():
    with pytest.raises(ValueError, match="decode_batch_knots"):
        BASE.with_overrides({"decode_batch_knots": [1, 8], "decode_batch_correction_us": [0]})
    with pytest.raises(ValueError, match="decode_batch_knots"):
        BASE.with_overrides({"decode_batch_knots": [8, 1], "decode_batch_correction_us": [0, 0]})
    with pytest.raises(ValueError, match="unknown compute fields"):
        BASE.with_overrides({"decode_overheads_us": 1})


# ---- the fit ---------------------------------------------------------------------------------------------------
def synthetic_rows(model: RooflineComputeModel, seed: int = 0) -> pd.DataFrame:
    """Iterations whose target is exactly ``model``'s time: decodes of 1-64 sequences, mixed batches."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(600):
        batch = int(rng.integers(1, 65))
        context = int(rng.integers(100, 3000))
        if i % 4:
            shape = decode_batch(batch, context)
        else:
            chunk = int(rng.integers(16, 2048 - batch))
            shape = BatchShape(new_tokens=batch + chunk, attention_pairs=batch * (context + 1) + chunk * (chunk + 1) / 2,
                               kv_read_tokens=batch * context, logit_sequences=batch + 1,
                               max_context_tokens=max(context + 1, chunk))
        rows.append({"new_tokens": shape.new_tokens, "attention_pairs": shape.attention_pairs,
                     "kv_read_tokens": shape.kv_read_tokens, "logit_sequences": shape.logit_sequences,
                     "max_context_tokens": shape.max_context_tokens,
                     "target_us": model.iteration_us(shape), "decode_only": shape.new_tokens == shape.logit_sequences})
    return pd.DataFrame(rows)


def test_fit_reproduces_iterations_of_a_known_model():
    truth = BASE.with_overrides({"decode_graphs": 1, "flops_efficiency": 0.7, "bw_efficiency": 0.6,
                                 "attention_flops_efficiency": 0.4, "overhead_us": 4000, "mixed_tile_rows": 100,
                                 "launch_floor_us": 12000, "decode_overhead_us": 2500, "attention_bytes_factor": 3,
                                 "wave_us_per_token": 0.8})
    rows = synthetic_rows(truth)
    params, errors = fit_compute(BASE.with_overrides({"decode_graphs": 1}), rows)
    # the parameters need not be unique (terms trade against each other); the times must come back
    assert errors["all"]["median"] < 0.005 and errors["all"]["p90"] < 0.02
    assert errors["decode_only"]["n"] + errors["mixed"]["n"] == len(rows)


def test_held_back_errors_never_fit_on_the_run_they_predict(monkeypatch):
    """``--form select``: each run is predicted by a fit on the other rows alone; on iterations of a known form-A
    model both runs' held-back errors are small (the other run determines the same parameters)."""
    from hwbackend.calibration import inloop

    truth = BASE.with_overrides({"decode_graphs": 1, "flops_efficiency": 0.7, "bw_efficiency": 0.6,
                                 "attention_flops_efficiency": 0.4, "overhead_us": 4000, "mixed_tile_rows": 100,
                                 "launch_floor_us": 12000, "decode_overhead_us": 2500, "attention_bytes_factor": 3,
                                 "wave_us_per_token": 0.8})
    rows = pd.concat([synthetic_rows(truth, seed=1).assign(source="run-a"),
                      synthetic_rows(truth, seed=2).assign(source="run-b")], ignore_index=True)
    seen = []
    real_fit = inloop.fit_compute

    def recording_fit(base, fit_rows, *args, **kwargs):
        seen.append(set(fit_rows["source"]))
        return real_fit(base, fit_rows, *args, **kwargs)

    monkeypatch.setattr(inloop, "fit_compute", recording_fit)
    result = inloop.held_back_errors(BASE.with_overrides({"decode_graphs": 1}), rows, ["run-a", "run-b"], 0.0,
                                     forms=("A",))
    assert seen == [{"run-b"}, {"run-a"}]
    assert set(result["A"]["runs"]) == {"run-a", "run-b"}
    assert all(0 <= v < 0.02 for v in result["A"]["runs"].values())
    assert result["A"]["score"] == pytest.approx(np.mean(list(result["A"]["runs"].values())), abs=1e-4)
    with pytest.raises(InLoopError, match="run-c"):
        inloop.held_back_errors(BASE, rows, ["run-c"], 0.0, forms=("A",))


def test_select_needs_two_runs():
    with pytest.raises(InLoopError, match="at least two runs"):
        calibrate_from_runs([str(TRAIN)], json.loads(PROFILE.read_text()), form="select")


def test_decode_correction_recovers_a_step_in_batch_size():
    fitted = BASE.with_overrides({"decode_graphs": 1, "decode_overhead_us": 2000})
    truth = fitted.with_overrides({"decode_batch_knots": [1, 24, 32, 64],
                                   "decode_batch_correction_us": [0, 0, 3000, 3000]})
    rows = synthetic_rows(truth)
    fields, errors = fit_decode_correction(fitted, rows)
    corrected = fitted.with_overrides(fields)
    for batch in (4, 16, 40, 60):
        assert corrected.iteration_us(decode_batch(batch, 1000)) == pytest.approx(
            truth.iteration_us(decode_batch(batch, 1000)), rel=0.02), batch
    assert errors["median"] < 0.01


def test_rows_targets_and_growth_by_hand(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    iterations = pd.DataFrame({"iteration": [0, 1, 2, 3], "duration_us": [10_000.0, 12_000, 20_000, 9_000],
                               "sync_stall_us": [100.0, 80, 8_100, 90], "sync_map_page_groups": [0, 0, 2, 0]})
    shapes = pd.DataFrame({"iteration": [0, 1, 2, 3], "new_tokens": [4, 4, 600, 4], "attention_pairs": [4e3] * 4,
                           "kv_read_tokens": [4000] * 4, "logit_sequences": [4, 4, 5, 4]})
    iterations.to_parquet(run / "iterations.parquet")
    shapes.to_parquet(run / "shapes.parquet")
    (run / "config.json").write_text(json.dumps({"backend": "hardware", "sync_mapping": True, "cuda_graphs": True}))
    rows, _ = load_rows(run)
    # step = median stall of the iterations that mapped nothing (100, 80, 90) = 90 us; iteration 2 maps
    # 2 page groups: mapping = 8100 - 90 = 8010 us, target = 20000 - 8010
    assert rows.attrs["step_us"] == 90
    assert rows["target_us"].tolist() == [10_000, 12_000, 20_000 - 8_010, 9_000]
    assert rows["decode_only"].tolist() == [True, True, False, True]
    assert growth_in_loop(rows) == {"mean_us": 4005.0, "page_groups": 2, "iterations": 1}
    (run / "shapes.parquet").unlink()
    with pytest.raises(InLoopError, match="shapes.parquet"):
        load_rows(run)


def test_fit_on_the_committed_h200_training_runs():
    if not (TRAIN_X2B / "shapes.parquet").is_file():
        pytest.skip(f"{TRAIN_X2B} is not present")
    profile = json.loads(PROFILE.read_text())
    runs = [str(TRAIN), str(TRAIN_X2), str(TRAIN_X2B)]
    sections = calibrate_from_runs(runs, profile)
    fit = sections["compute_in_loop"]
    assert fit["params"]["decode_graphs"] == 1.0 and [r["iterations"] for r in fit["runs"]] == [12418, 6484, 3788]
    assert fit["params"]["wave_us_per_token"] > 0  # the longest sequence's keys cost time of their own
    # measured 2026-11-29: median 3.3%, p90 10.1% over 22,690 iterations (docs/validation/README.md)
    assert fit["fit_error"]["all_corrected"]["median"] < 0.05
    growth = sections["vmm_in_loop"]
    assert growth["in_loop_growth"]["page_groups"] > 0 and growth["growth_scale"] > 1
    # the committed profile holds this fit: its times agree (parameters can trade off across scipy builds)
    rows = pd.concat([load_rows(r)[0] for r in runs], ignore_index=True)
    from hwbackend.calibration.inloop import shape_columns
    committed = BASE.with_overrides(profile["compute_in_loop"]["params"]).iteration_us_array(*shape_columns(rows))
    refitted = BASE.with_overrides(fit["params"]).iteration_us_array(*shape_columns(rows))
    assert np.median(np.abs(refitted / committed - 1)) < 0.01
    assert profile["vmm_in_loop"]["growth_scale"] == growth["growth_scale"]


def test_bad_inputs_name_the_run_or_field(tmp_path):
    with pytest.raises(InLoopError, match="does not exist"):
        load_rows(tmp_path / "nope")
    if not (TRAIN / "shapes.parquet").is_file():
        pytest.skip(f"{TRAIN} is not present")
    with pytest.raises(InLoopError, match="given twice"):
        calibrate_from_runs([str(TRAIN), str(TRAIN)], json.loads(PROFILE.read_text()))
    with pytest.raises(InLoopError, match="page_group_growth"):
        calibrate_from_runs([str(TRAIN)], {"format": "kvsim-profile/1", "page_group_growth": [1]})
    run = tmp_path / "run"
    shutil.copytree(TRAIN, run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "model": "llama-2-7b"}))
    with pytest.raises(InLoopError, match="transformer_shape"):
        calibrate_from_runs([str(run)], json.loads(PROFILE.read_text()))
    pd.read_parquet(TRAIN / "shapes.parquet").drop(columns="kv_read_tokens").to_parquet(run / "shapes.parquet")
    with pytest.raises(InLoopError, match="kv_read_tokens"):
        load_rows(run)


def test_runs_without_the_longest_context_fit_without_the_wave_term():
    old = RUNS / "train-sync"  # replayed before max_context_tokens was logged
    if not (old / "shapes.parquet").is_file():
        pytest.skip(f"{old} is not present")
    fit = calibrate_from_runs([str(old)], json.loads(PROFILE.read_text()))["compute_in_loop"]
    assert "wave_us_per_token" not in fit["params"] and fit["fit_error"]["all_corrected"]["median"] < 0.05


def test_cli_from_run_adds_sections_and_asks_before_replacing(tmp_path, capsys):
    from cli import main

    if not (TRAIN / "shapes.parquet").is_file():
        pytest.skip(f"{TRAIN} is not present")
    profile = tmp_path / "p.json"
    data = json.loads(PROFILE.read_text())
    data.pop("compute_in_loop")
    data.pop("vmm_in_loop")
    profile.write_text(json.dumps(data))
    assert main(["calibrate", "--from-run", str(TRAIN), "--out", str(profile)]) == 0
    written = json.loads(profile.read_text())
    assert {"compute_in_loop", "vmm_in_loop", "vmm", "compute"} <= set(written)
    before = profile.read_text()
    # a refusal exits 2 with one line, as every kvsim refusal (it exited 1)
    assert main(["calibrate", "--from-run", str(TRAIN), "--out", str(profile)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert profile.read_text() == before and line == (f"kvsim: error: calibrate: {profile} already holds "
                                                      "compute_in_loop; pass --force to replace it")
    assert main(["calibrate", "--from-run", str(tmp_path), "--out", str(profile), "--force"]) == 2
    assert "iterations.parquet" in capsys.readouterr().err
    assert main(["calibrate", "--from-run", str(TRAIN), "--out", str(tmp_path / "missing.json"),
                 "--page-sizes", "3MiB", "--samples", "5"]) == 2
    err = capsys.readouterr().err       # a GPU measurement's flags are said to change nothing (helper-48)
    assert "does not exist" in err
    assert ("kvsim: note: calibrate --from-run fits on saved files and measures nothing on a GPU: --page-sizes, "
            "--samples ignored") in err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert main(["calibrate", "--from-run", str(TRAIN), "--out", str(tmp_path / "list.json")]) == 2
    assert "not a kvsim-profile/1 profile" in capsys.readouterr().err


def test_in_loop_fit_is_used_only_for_its_model():
    from sim.core.runner import compute_overrides, load_models, resolve_compute_model

    profile = json.loads(PROFILE.read_text())
    assert resolve_compute_model(profile, "auto", CONFIG) == "in-loop"
    other = SimConfig(model="llama-2-7b")
    assert resolve_compute_model(profile, "auto", other) == "tiled"
    assert resolve_compute_model(profile, "auto", SimConfig(gpu="a100")) == "roofline"  # both fits measured on the H200
    with pytest.raises(ValueError, match="must be a list"):
        BASE.with_overrides({"decode_batch_knots": 3.0, "decode_batch_correction_us": [1.0]})
    with pytest.raises(ValueError, match="fitted for llama-3-8b"):
        compute_overrides(profile, "in-loop", other)
    vmm, compute = load_models(CONFIG, str(PROFILE))
    assert compute.decode_graphs == 1 and vmm.in_loop_scale == profile["vmm_in_loop"]["growth_scale"]
    vmm, compute = load_models(CONFIG, str(PROFILE), "tiled")
    assert compute.decode_graphs == 0 and vmm.in_loop_scale == 1.0


def test_a_run_must_say_whether_decodes_ran_as_graphs(tmp_path):
    if not (TRAIN / "shapes.parquet").is_file():
        pytest.skip(f"{TRAIN} is not present")
    run = tmp_path / "run"
    shutil.copytree(TRAIN, run)
    config = json.loads((run / "config.json").read_text())
    for value in ("missing", "yes"):
        edited = {k: v for k, v in config.items() if k != "cuda_graphs"}
        if value != "missing":
            edited["cuda_graphs"] = value
        (run / "config.json").write_text(json.dumps(edited))
        with pytest.raises(InLoopError, match="config.json: field cuda_graphs is 'yes'" if value == "yes"
                           else "config.json: field cuda_graphs is 'missing'"):
            load_rows(run)


def test_in_loop_growth_scale_applies_at_its_own_tp_only(tmp_path):
    """vmm_in_loop records the tp its growths were measured at; a growth measured at tp 2 (two processes mapping
    at once) is not applied at tp 1, nor one measured at tp 1 at tp 2 (profiles older than the field: tp 1)."""
    from sim.core.runner import load_models

    profile = json.loads(PROFILE.read_text())
    assert load_models(CONFIG, str(PROFILE))[0].in_loop_scale == profile["vmm_in_loop"]["growth_scale"]
    profile["vmm_in_loop"]["tp"] = 2
    path = tmp_path / "tp2.json"
    path.write_text(json.dumps(profile))
    assert load_models(CONFIG, str(path))[0].in_loop_scale == 1.0


def test_calibrate_form_choices_are_the_fitted_forms():
    """``kvsim calibrate --form`` lists its choices literally (its --help imports no numpy); they must be the
    forms the fit knows, plus the rules that pick among them (``auto``, ``select``)."""
    import argparse

    from hwbackend import cli
    from hwbackend.calibration.inloop import FORM_RULES, FORMS

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    calibrate = parser._subparsers._group_actions[0].choices["calibrate"]
    form = next(action for action in calibrate._actions if action.dest == "form")
    assert tuple(form.choices) == (*FORMS, *FORM_RULES)


def test_a_fit_on_engine_runs_drops_the_harness_grid_fits(tmp_path, capsys):
    """The base profile's compute.roofline / tiled_roofline (kvsim calibrate --compute: the harness's grid) leave a
    profile fitted on engine replays, so a model outside compute_in_loop gets the built-in roofline and is told
    so, not the harness's timing (the Qwen tenant of docs/validation/colocate ran +68% at iteration p50 on it)."""
    from cli import main
    from sim.core.runner import compute_model_source

    run = ROOT / "docs" / "validation" / "engine-profile" / "train-code-sync"
    out = tmp_path / "engine.json"
    shutil.copy(PROFILE, out)
    assert {"roofline", "tiled_roofline"} <= set(json.loads(out.read_text())["compute"])
    assert main(["calibrate", "--from-run", str(run), "--form", "A", "--out", str(out), "--force"]) == 0
    assert "compute.roofline and compute.tiled_roofline" in capsys.readouterr().err
    profile = json.loads(out.read_text())
    assert not {"roofline", "tiled_roofline"} & set(profile["compute"])
    assert profile["compute_in_loop"]["replay_compute"] == "engine"
    chosen, text = compute_model_source(SimConfig(model="qwen2.5-7b"), str(out))
    assert chosen == "roofline" and text.startswith("roofline (built-in defaults: ")
    assert "compute_in_loop was fitted for llama-3-8b on h200 at tp 1, not qwen2.5-7b on h200 at tp 1" in text
    assert compute_model_source(SimConfig(), str(out))[0] == "in-loop"      # llama-3-8b, the run's model


def test_calibrate_refuses_a_co_located_run_and_its_tenants(tmp_path, capsys):
    """A new-user trial: --from-run on a tenant folder of a python -m hwbackend.replay.colocate run was fitted on
    (its iteration times hold the other tenant's work on the shared GPU). The tenant folder, the run folder and a
    tenant folder copied out of its run (config.json names its tenant) are refused with one line and exit 2; the
    profile is left as it was."""
    from cli import main

    run = ROOT / "docs" / "validation" / "colocate" / "elastic"
    tenant = run / "tenants" / "t0-llama-3.1-8b"
    copied = tmp_path / "t0"
    shutil.copytree(tenant, copied)
    out = tmp_path / "p.json"
    shutil.copy(ROOT / "profiles" / "h200-engine.json", out)
    before = out.read_text()
    for folder, named in ((tenant, f"tenant 't0-llama-3.1-8b' of the co-located run {run}"),
                          (run, "a co-located run (summary.json lists its tenants)"),
                          (copied, "config.json names tenant 't0-llama-3.1-8b' of a co-located run")):
        assert main(["calibrate", "--from-run", str(folder), "--out", str(out), "--force"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert named in line and "calibration from a co-located run is not supported" in line
        assert "tenants share the GPU's compute" in line and out.read_text() == before


@pytest.mark.parametrize("column, value, needle", [("duration_us", float("nan"), "not a finite number (got nan)"),
                                                   ("duration_us", -5.0, "must be >= 0 (got -5.0)"),
                                                   ("sync_stall_us", float("inf"), "not a finite number (got inf)")])
def test_a_bad_iteration_value_is_named_by_row_and_column_before_the_fit(tmp_path, column, value, needle):
    """A NaN duration reached the fitting library ('Residuals are not finite in the initial point') and a negative
    one blamed a fitted field; a truncated file is named as corrupt."""
    run = tmp_path / "run"
    run.mkdir()
    iterations = pd.DataFrame({"iteration": [0, 1, 2], "duration_us": [10_000.0, 12_000, 9_000],
                               "sync_stall_us": [100.0, 80, 90], "sync_map_page_groups": [0, 0, 0]})
    iterations.loc[1, column] = value
    shapes = pd.DataFrame({"iteration": [0, 1, 2], "new_tokens": [4, 4, 4], "attention_pairs": [4e3] * 3,
                           "kv_read_tokens": [4000] * 3, "logit_sequences": [4, 4, 4]})
    iterations.to_parquet(run / "iterations.parquet")
    shapes.to_parquet(run / "shapes.parquet")
    (run / "config.json").write_text(json.dumps({"backend": "hardware", "sync_mapping": True, "cuda_graphs": True}))
    with pytest.raises(InLoopError, match=f"iterations.parquet: row 2, column '{column}': ") as error:
        load_rows(run)
    assert needle in str(error.value)
    data = (run / "shapes.parquet").read_bytes()
    (run / "shapes.parquet").write_bytes(data[: len(data) // 2])
    iterations.loc[1, column] = 1.0
    iterations.to_parquet(run / "iterations.parquet")
    with pytest.raises(InLoopError, match="shapes.parquet: unreadable or corrupt"):
        load_rows(run)
