"""A bad calibration profile gives one message naming the file, the field and the value, and exit status 2:
never a traceback, never a silently wrong run (``sim.timing.latency.check_profile``, ``sim.core.runner.load_models``,
``sim.timing.compute.check_compute_field``). Each case corrupts a copy of ``profiles/h200.json``."""
import copy
import json
from pathlib import Path

import pytest

from sim.core.runner import load_models
from cli import main
from sim.timing.compute import ComputeFieldError
from sim.setup.config import SimConfig
from sim.timing.latency import ProfileError, VmmLatencyModel, read_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "h200.json"
HW_RUN = ROOT / "docs" / "validation" / "same-start" / "test-sync-x1"
DELETE = object()
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def base() -> dict:
    return json.loads(PROFILE.read_text())


def corrupt(base: dict, tmp_path: Path, changes: dict) -> Path:
    """A copy of the committed profile with ``{"a/b/c": value}`` set (``DELETE`` removes the key)."""
    data = copy.deepcopy(base)
    for where, value in changes.items():
        *parents, leaf = where.split("/")
        node = data
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


KNOTS = "compute_in_loop/params/decode_batch_knots"
CORRECTION = "compute_in_loop/params/decode_batch_correction_us"
# (changes, field path the message must name, value it must show (None: no value to show))
CASES = [
    # the tester's six
    ({"page_group_growth": [1]}, "field page_group_growth ", "[1]"),
    ({"compute_in_loop/params/decode_overhead_us": "x"}, "field compute_in_loop.params.decode_overhead_us ", '"x"'),
    ({"compute_in_loop/params/decode_overhead_us": None}, "field compute_in_loop.params.decode_overhead_us ", "null"),
    ({"compute_in_loop/params": "abc"}, "field compute_in_loop.params ", '"abc"'),
    ({"vmm_in_loop/growth_scale": "big"}, "field vmm_in_loop.growth_scale ", '"big"'),
    ({"compute_in_loop/params/wave_us_per_token": -1e6}, "field compute_in_loop.params.wave_us_per_token ", "-1000000.0"),
    ({"vmm": "oops"}, "field vmm ", '"oops"'),
    # every section's type
    ({"vmm": DELETE}, "field vmm is missing", None),
    ({"vmm/cuMemMap": DELETE}, "field vmm.cuMemMap is missing", None),
    ({"vmm/cuMemMap": []}, "field vmm.cuMemMap ", "[]"),
    ({"vmm/cuMemMap": {}}, "field vmm.cuMemMap holds no page size", "{}"),
    ({"vmm/cuMemMap/2MiB": {"samples_us": [1.0]}}, "field vmm.cuMemMap has a page-size key", '"2MiB"'),
    ({"vmm/cuMemMap/2097152": "x"}, "field vmm.cuMemMap.2097152 ", '"x"'),
    ({"page_group_growth/llama-3-8b": 7}, "field page_group_growth.llama-3-8b ", "7"),
    ({"compute": "x"}, "field compute ", '"x"'),
    ({"compute/roofline": []}, "field compute.roofline ", "[]"),
    ({"compute/tiled_roofline": "x"}, "field compute.tiled_roofline ", '"x"'),
    ({"compute/tiled_roofline/params": 1}, "field compute.tiled_roofline.params ", "1"),
    ({"compute_in_loop": None}, "field compute_in_loop ", "null"),
    ({"vmm_in_loop": "x"}, "field vmm_in_loop ", '"x"'),
    ({"paged_attention": []}, "field paged_attention ", "[]"),
    ({"layout": "x"}, "field layout ", '"x"'),
    ({"memory": 3}, "field memory ", "3"),
    # VMM latency distributions: negative, non-finite, wrong type, empty, unordered, incomplete
    ({"vmm/cuMemMap/2097152/samples_us": [1.0, -2.0]}, "field vmm.cuMemMap.2097152.samples_us[1] ", "-2.0"),
    ({"vmm/cuMemMap/2097152/samples_us": [NAN]}, "field vmm.cuMemMap.2097152.samples_us[0] ", "NaN"),
    ({"vmm/cuMemMap/2097152/samples_us": [1.0, INF]}, "field vmm.cuMemMap.2097152.samples_us[1] ", "Infinity"),
    ({"vmm/cuMemMap/2097152/samples_us": [1.0, "2"]}, "field vmm.cuMemMap.2097152.samples_us[1] ", '"2"'),
    ({"vmm/cuMemMap/2097152/samples_us": []}, "field vmm.cuMemMap.2097152.samples_us ", "[]"),
    ({"vmm/cuMemMap/2097152/samples_us": 5}, "field vmm.cuMemMap.2097152.samples_us ", "5"),
    ({"vmm/cuMemSetAccess/2097152": {"quantiles_us": {"p50": 9, "p90": 1, "p99": 2, "mean": 3}}},
     "field vmm.cuMemSetAccess.2097152.quantiles_us must have p50 <= p90 <= p99", '"p50": 9'),
    ({"vmm/cuMemSetAccess/2097152": {"quantiles_us": {"p50": -1, "p90": 1, "p99": 2, "mean": 3}}},
     "field vmm.cuMemSetAccess.2097152.quantiles_us.p50 ", "-1"),
    ({"vmm/cuMemSetAccess/2097152": {"quantiles_us": {"p50": 1, "p90": 1, "p99": 2}}},
     "field vmm.cuMemSetAccess.2097152 needs samples_us or quantiles_us", "missing mean"),
    ({"page_group_growth/llama-3-8b/num_sub_tensors": 0}, "field page_group_growth.llama-3-8b.num_sub_tensors ", "0"),
    ({"page_group_growth/llama-3-8b/num_sub_tensors": 1.5}, "field page_group_growth.llama-3-8b.num_sub_tensors ",
     "1.5"),
    ({"page_group_growth/llama-3-8b/page_size_bytes": "2MiB"}, "field page_group_growth.llama-3-8b.page_size_bytes ",
     '"2MiB"'),
    ({"page_group_growth/llama-3-8b/sync_us": DELETE}, "field page_group_growth.llama-3-8b.sync_us is missing", None),
    ({"page_group_growth/llama-3-8b/sync_us/samples_us": [-5]},
     "field page_group_growth.llama-3-8b.sync_us.samples_us[0] ", "-5"),
    ({"page_group_growth/llama-3-8b/batched_set_access_us/quantiles_us/mean": "x"},
     "field page_group_growth.llama-3-8b.batched_set_access_us.quantiles_us.mean ", '"x"'),
    # compute fields: physical ranges, in every compute section
    ({"compute_in_loop/params/decode_overhead_us": NAN}, "field compute_in_loop.params.decode_overhead_us ", "NaN"),
    ({"compute_in_loop/params/overhead_us": INF}, "field compute_in_loop.params.overhead_us ", "Infinity"),
    ({"compute_in_loop/params/launch_floor_us": -1}, "field compute_in_loop.params.launch_floor_us ", "-1"),
    ({"compute_in_loop/params/mixed_tile_rows": -1}, "field compute_in_loop.params.mixed_tile_rows ", "-1"),
    ({"compute_in_loop/params/flops_efficiency": 0}, "field compute_in_loop.params.flops_efficiency ", "0"),
    ({"compute_in_loop/params/bw_efficiency": -0.5}, "field compute_in_loop.params.bw_efficiency ", "-0.5"),
    ({"compute_in_loop/params/attention_bytes_factor": 0}, "field compute_in_loop.params.attention_bytes_factor ", "0"),
    ({"compute_in_loop/params/attention_flops_efficiency": True},
     "field compute_in_loop.params.attention_flops_efficiency ", "true"),
    ({"compute_in_loop/params/decode_graphs": 2}, "field compute_in_loop.params.decode_graphs ", "2"),
    ({"compute_in_loop/params/typo_us": 1}, "field compute_in_loop.params.typo_us is not a compute-model field", None),
    ({KNOTS: [2, 1] + list(range(3, 14))}, "field compute_in_loop.params.decode_batch_knots must increase", "[2, 1"),
    ({KNOTS: [0] + list(range(2, 14))}, "field compute_in_loop.params.decode_batch_knots[0] ", "0"),
    ({KNOTS: "x"}, "field compute_in_loop.params.decode_batch_knots ", '"x"'),
    ({KNOTS: [], CORRECTION: []}, "field compute_in_loop.params.decode_batch_knots ", "[]"),
    ({KNOTS: [1, 2]}, "field compute_in_loop.params.decode_batch_correction_us must have one value per", "157.4"),
    ({KNOTS: DELETE}, "field compute_in_loop.params.decode_batch_knots is missing", None),
    ({CORRECTION: [NAN] * 13}, "field compute_in_loop.params.decode_batch_correction_us[0] ", "NaN"),
    ({"compute_in_loop/model": DELETE}, "field compute_in_loop.model is missing", None),
    ({"compute_in_loop/tp": "1"}, "field compute_in_loop.tp ", '"1"'),
    ({"compute_in_loop/tp": 0}, "field compute_in_loop.tp ", "0"),
    ({"compute/roofline/overhead_us": -5}, "field compute.roofline.overhead_us ", "-5"),
    ({"compute/roofline/flops_efficiency": "fast"}, "field compute.roofline.flops_efficiency ", '"fast"'),
    ({"compute/tiled_roofline/params/tile_rows": -1}, "field compute.tiled_roofline.params.tile_rows ", "-1"),
    ({"compute/tiled_roofline/params/bw_efficiency": NAN}, "field compute.tiled_roofline.params.bw_efficiency ", "NaN"),
    ({"compute/tiled_roofline/params/mixed_tile_rows": 5},
     "field compute.tiled_roofline.params.mixed_tile_rows is named tile_rows", None),
    # VMM growth scale and the measured factors / rates
    ({"vmm_in_loop/growth_scale": 0}, "field vmm_in_loop.growth_scale ", "0"),
    ({"vmm_in_loop/growth_scale": None}, "field vmm_in_loop.growth_scale ", "null"),
    ({"vmm_in_loop/growth_scale": DELETE}, "field vmm_in_loop.growth_scale is missing", None),
    ({"vmm_in_loop/page_size_bytes": -2}, "field vmm_in_loop.page_size_bytes ", "-2"),
    ({"vmm_tp/worker_scale/2": 0}, "field vmm_tp.worker_scale.2 ", "0"),
    ({"vmm_tp/worker_scale/2": "x"}, "field vmm_tp.worker_scale.2 ", '"x"'),
    ({"vmm_tp/worker_scale": [1.4]}, "field vmm_tp.worker_scale ", "[1.4]"),
    ({"vmm_tp/worker_scale": DELETE}, "field vmm_tp.worker_scale is missing", None),
    ({"paged_attention/factor": 0.5}, "field paged_attention.factor ", "0.5"),
    ({"layout/cross_layer_attention_factor": 0}, "field layout.cross_layer_attention_factor ", "0"),
    ({"memory/memset_bytes_per_s": -1}, "field memory.memset_bytes_per_s ", "-1"),
    ({"memory/copy_bytes_per_s": 10 ** 400}, "field memory.copy_bytes_per_s ", "1000000"),
]


@pytest.mark.parametrize("changes, field, value", CASES, ids=[
    f"{i}-{next(iter(c))}" for i, (c, _, _) in enumerate(CASES)])
def test_bad_field_is_named_when_the_profile_is_read(base, tmp_path, changes, field, value):
    path = corrupt(base, tmp_path, changes)
    with pytest.raises(ProfileError) as exc:
        read_profile(path)
    message = str(exc.value)
    assert message.startswith(f"profile {path}: {field}"), message
    assert value is None or value in message, message
    assert "\n" not in message


@pytest.mark.parametrize("content, message", [
    (None, "cannot read it"),                      # a directory
    ("[" * 100_000, "not a JSON file"),            # nested too deeply for the parser
    ("", "not a JSON file"),
    ('{"format": "kvsim-profile/2"}', "field 'format' must be 'kvsim-profile/1'"),
])
def test_unreadable_file_is_named(tmp_path, content, message):
    path = tmp_path / "p.json"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(ProfileError, match=rf"^profile {path}: {message}"):
        read_profile(path)


def test_negative_decode_correction_is_refused_when_the_models_are_built(base, tmp_path):
    """Each correction is a finite number, but together with decode_overhead_us one makes a graphed decode
    iteration negative (was: SimPy's 'Negative delay' deep inside the run)."""
    path = corrupt(base, tmp_path, {CORRECTION: [-1e9] * 13})
    read_profile(path)  # every field alone is in range
    with pytest.raises(ProfileError, match=rf"^profile {path}: field compute_in_loop.params.decode_batch_correction_us "
                                           r"gives a graphed decode iteration of batch 1 a negative time"):
        load_models(SimConfig(), str(path))
    load_models(SimConfig(), str(path), "tiled")  # not used by the tiled model: no error


def test_compute_overrides_name_the_field_and_value():
    """``with_overrides`` (fits, programmatic use) names the one bad field, not all of them."""
    from sim.setup.catalog import get_gpu, get_model
    from sim.timing.compute import RooflineComputeModel

    base = RooflineComputeModel(get_model("llama-3-8b"), get_gpu("h200"))
    with pytest.raises(ComputeFieldError, match=r'^decode_overhead_us must be a finite number >= 0 \(us\), got "x"$'):
        base.with_overrides({"flops_efficiency": 0.7, "decode_overhead_us": "x"})
    with pytest.raises(ComputeFieldError, match=r"^wave_us_per_token must be .* got -1$"):
        base.with_overrides({"wave_us_per_token": -1})


def test_good_profiles_still_load(base, tmp_path):
    """The committed profile is unchanged in effect, and a hand-written one with quantiles only (no samples,
    growths or compute sections) is accepted."""
    vmm, compute = load_models(SimConfig(), str(PROFILE))
    assert compute.decode_graphs == 1 and vmm.in_loop_scale == base["vmm_in_loop"]["growth_scale"]
    quantiles = {"quantiles_us": {"p50": 5.0, "p90": 9.0, "p99": 15.0, "mean": 8.0}}
    minimal = tmp_path / "minimal.json"
    minimal.write_text(json.dumps({"format": "kvsim-profile/1", "vmm": {
        call: {"2097152": quantiles} for call in ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                                  "cuMemRelease")}}))
    model = VmmLatencyModel.from_profile(minimal)
    assert model.distribution("cuMemMap", 2 * 2**20).mean_us() == pytest.approx(8.0)


REPORTED = [({"page_group_growth": [1]}, "field page_group_growth "),
            ({"compute_in_loop/params/decode_overhead_us": "x"}, "field compute_in_loop.params.decode_overhead_us "),
            ({"compute_in_loop/params": "abc"}, "field compute_in_loop.params "),
            ({"vmm_in_loop/growth_scale": "big"}, "field vmm_in_loop.growth_scale "),
            ({"compute_in_loop/params/wave_us_per_token": -1e6}, "field compute_in_loop.params.wave_us_per_token "),
            ({"vmm": "oops"}, "field vmm "),
            ({CORRECTION: [-1e9] * 13}, "field compute_in_loop.params.decode_batch_correction_us ")]


@pytest.mark.parametrize("changes, field", REPORTED, ids=[next(iter(c)) for c, _ in REPORTED])
def test_simulate_gives_one_line_and_exit_2(base, tmp_path, capsys, changes, field):
    path = corrupt(base, tmp_path, changes)
    out = tmp_path / "run"
    assert main(["simulate", "--profile", str(path), "--num-requests", "5", "--quiet", "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" not in line]
    assert len(err) == 1 and f"profile {path}: {field}" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("changes, field", REPORTED[::3], ids=[next(iter(c)) for c, _ in REPORTED[::3]])
def test_validate_gives_one_line_and_exit_2(base, tmp_path, capsys, changes, field):
    path = corrupt(base, tmp_path, changes)
    out = tmp_path / "validation"
    assert main(["validate", "--hw-run", str(HW_RUN), "--profile", str(path), "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"profile {path}: {field}" in err[0] and "Traceback" not in err[0], err
    assert not (out / "validation.md").exists()
