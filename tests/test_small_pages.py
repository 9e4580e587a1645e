"""Pages below 2 MiB: vAttention's modified-driver path (issue 28 item 11; sim/timing/latency.py).

The paper's allocation bandwidth with 64 KB pages is 7.6 GB/s (vAttention ASPLOS'25 section 7.3, quoted in
issue 28): one 64 KiB page maps in 65,536 / 7.6e9 s = 8.623 us. Before, a 64 KiB page cost one 2 MiB
cuMemMap + cuMemSetAccess (x the measured growth scale): ~41 us, 1.6 GB/s.
"""
import math

import numpy as np
import pytest

from sim.setup.config import ConfigError, SimConfig
from sim.core.engine import Simulator
from sim.timing.latency import MODIFIED_DRIVER_MAP_BYTES_PER_S, VmmLatencyModel, modified_driver_page_us
from sim.frontend.policy_spec import parse_policy, policy_config_error
from sim.units import KIB, MIB
from tests.helpers import ConstantCompute, trace

PAGE_64K_US = 65536 / 7.6e9 * 1e6     # 8.6232 us


def test_64k_group_maps_at_the_papers_bandwidth():
    """Llama-3-8B page group: 64 pages of 64 KiB = 4 MiB in 64 x 8.623 = 551.9 us = 7.6 GB/s; no draw."""
    model = VmmLatencyModel.builtin()
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    map_us = model.page_group_map_us(1, 64, 64 * KIB, rng)
    assert map_us == pytest.approx(64 * PAGE_64K_US)
    assert 64 * 65536 / (map_us * 1e-6) == pytest.approx(7.6e9)
    assert model.page_group_map_us(3, 64, 64 * KIB, rng) == pytest.approx(3 * 64 * PAGE_64K_US)
    assert rng.bit_generator.state == state          # deterministic: the generator is left as it was


def test_unmap_create_release_cost_one_page_time_each():
    model = VmmLatencyModel.builtin()
    rng = np.random.default_rng(0)
    for call in ("cuMemUnmap", "cuMemCreate", "cuMemRelease"):
        assert model.total_us(call, 64 * KIB, 10, rng) == pytest.approx(10 * PAGE_64K_US)


def test_sizes_without_an_entry_keep_the_nearest_entrys_time_per_page():
    """128 and 256 KiB: 8.623 us per page (a call's cost nearly independent of size), i.e. 15.2 and 30.4 GB/s."""
    assert list(MODIFIED_DRIVER_MAP_BYTES_PER_S) == [64 * KIB]
    for page in (128 * KIB, 256 * KIB, 1 * MIB):
        assert modified_driver_page_us(page) == pytest.approx(PAGE_64K_US)
    assert 256 * KIB / (modified_driver_page_us(256 * KIB) * 1e-6) == pytest.approx(4 * 7.6e9)


def test_the_old_model_overstated_a_64k_page_about_five_fold():
    """The stock 2 MiB calls at the nearest size (what 64 KiB cost before): ~41 us a page, ~1.6 GB/s."""
    stock = VmmLatencyModel.builtin()
    stock.modified_driver_below_2mib = False
    per_page_us = ((stock.distribution("cuMemMap", 64 * KIB).mean_us()
                    + stock.distribution("cuMemSetAccess", 64 * KIB).mean_us()) * stock.growth_scale(64 * KIB))
    assert 65536 / (per_page_us * 1e-6) == pytest.approx(1.6e9, rel=0.05)
    assert 4 < per_page_us / PAGE_64K_US < 5


def test_2mib_pages_still_draw_the_measured_stock_calls():
    """2 MiB: one draw from the measured growth distribution, as before (the generator advances)."""
    model = VmmLatencyModel.builtin()
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    map_us = model.page_group_map_us(1, 64, 2 * MIB, rng)
    assert rng.bit_generator.state != state and map_us > 64 * PAGE_64K_US


def test_sync_crossing_costs_a_modified_driver_group():
    """Synchronous mapping, 64 KiB pages (32 tokens): an iteration that crosses into a new page maps one group,
    1,000 us of compute + 64 x 8.623 us."""
    config = SimConfig(page_size_bytes=64 * KIB, sync_mapping=True)
    out = Simulator(config, trace([(0.0, 32, 200)]), compute=ConstantCompute(1000.0)).run()
    it = out.iterations_frame()
    crossing = it[it["sync_map_page_groups"] == 1].iloc[1:]
    assert len(crossing) == math.ceil((32 + 200 - 1) / 32) - 1
    assert crossing["duration_us"].to_numpy() == pytest.approx(1000.0 + 64 * PAGE_64K_US)


def test_config_marks_and_refuses():
    config = SimConfig(page_size_bytes=256 * KIB)
    assert "modified-driver" in config.label and config.to_dict()["vmm_driver_used"].startswith("modified")
    assert any("modified NVIDIA UVM driver, not the stock CUDA VMM API" in note for note in config.notes)
    assert "modified-driver" not in SimConfig().label and "vmm_driver_used" not in SimConfig().to_dict()
    assert SimConfig(vmm_driver="stock").page_size_bytes == 2 * MIB           # 2 MiB on the stock API: fine
    for spec, expected in (("vattention:page=64KiB,driver=stock", "page=64KiB with driver=stock: the stock CUDA VMM "
                                                                  "API allocates 2 MiB pages at least"),
                           ("vattention:page=256KiB,batched=on", "batched=on with page=256KiB")):
        with pytest.raises(ConfigError) as error:
            try:
                SimConfig().with_overrides(parse_policy(spec))
            except ConfigError as exc:
                raise policy_config_error(spec, exc) from None
        assert expected in str(error.value)
