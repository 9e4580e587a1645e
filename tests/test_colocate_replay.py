"""The co-located hardware replay (``python -m hwbackend.replay.colocate``, issue 34 item 4) on the CPU (emulated
driver, tiny decoders with each model's KV head shape), its first-come-first-served interleaving on a fake clock,
and ``kvsim validate`` of a co-located run."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from hwbackend.replay.colocate import serve

WEIGHTS_BYTES = 16060522496 + 15230974976    # llama-3.1-8b + qwen2.5-7b (sim/setup/catalog.toml), bf16
H200_HBM_BYTES = 150754820096


# ---- interleaving on a fake clock ----------------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.us = 0.0


class _Req:
    def __init__(self, arrival_us: float, iterations: int):
        self.arrival_at_us, self.left = arrival_us, iterations


class _Executor:
    def __init__(self, loop):
        self.loop, self.trims_at_us = loop, []

    def reclaim_idle(self) -> int:
        self.trims_at_us.append(self.loop.clock.us)
        return 1


class _FakeLoop:
    """A tenant whose every request takes ``iterations`` iterations of ``iteration_us`` each, one at a time."""

    def __init__(self, name, clock, arrivals_us, iterations, iteration_us, log):
        self.name, self.clock, self.iteration_us, self.log = name, clock, iteration_us, log
        self.requests = [_Req(a, iterations) for a in arrivals_us]
        self.waiting, self.running, self._next, self.num_done = [], [], 0, 0
        self.executor = _Executor(self)

    def begin(self, t0_ns):
        pass

    def now_us(self):
        return self.clock.us

    @property
    def done(self):
        return self.num_done == len(self.requests)

    @property
    def next_arrival_us(self):
        return self.requests[self._next].arrival_at_us if self._next < len(self.requests) else float("inf")

    def accept_arrivals(self):
        while self._next < len(self.requests) and self.requests[self._next].arrival_at_us <= self.clock.us:
            if self.requests[self._next].left:
                self.waiting.append(self.requests[self._next])
            else:           # a request of 0 iterations stands for one rejected on arrival (it never fits)
                self.num_done += 1
            self._next += 1
        return bool(self.running or self.waiting)

    def serve_pass(self, start_us):
        if not self.running:
            self.running.append(self.waiting.pop(0))
        self.log.append((self.name, self.clock.us))
        self.clock.us += self.iteration_us
        request = self.running[0]
        request.left -= 1
        if not request.left:
            self.running.clear()
            self.num_done += 1
        return True


def _sleep(clock):
    def sleep(seconds):
        clock.us += seconds * 1e6
    return sleep


def test_iterations_are_first_come_first_served():
    """A from 0 us (3 iterations), B from 5 us (2), 10 us each: A runs alone first; then the one whose iteration
    became ready first (B at 5 < A at 10, then A at 20 < B at 30, ...): A B A B A, B's waits 5 + 10 us."""
    clock, log = _Clock(), []
    a = _FakeLoop("A", clock, [0.0], 3, 10.0, log)
    b = _FakeLoop("B", clock, [5.0], 2, 10.0, log)
    wait_us, trims = serve([a, b], None, _sleep(clock))
    assert log == [("A", 0.0), ("B", 10.0), ("A", 20.0), ("B", 30.0), ("A", 40.0)]
    assert wait_us == [10.0 + 10.0, 5.0 + 10.0]      # A waits 20-10 and 40-30; B 10-5 and 30-20
    assert trims == [0, 0]


def test_idle_tenants_are_trimmed_after_the_delay_even_when_done():
    """A serves at 0 and at 100 us (10 us each), B at 200 us; trim delay 15 us: A is trimmed at 25 and 125 us
    (the clock sleeps to the trim deadline, not only to the next arrival); B never idles before the end."""
    clock, log = _Clock(), []
    a = _FakeLoop("A", clock, [0.0, 100.0], 1, 10.0, log)
    b = _FakeLoop("B", clock, [200.0], 1, 10.0, log)
    _, trims = serve([a, b], 15.0, _sleep(clock))
    assert a.executor.trims_at_us == [25.0, 125.0] and trims == [2, 0]
    assert b.executor.trims_at_us == []
    assert [name for name, _ in log] == ["A", "A", "B"]


def test_serving_ends_when_the_last_requests_are_rejected_on_arrival():
    """A serves one request at 0 us; B's only request (at 50 us) and A's second (at 60 us) are rejected on
    arrival: every loop is then done with nothing ready (was: min() of an empty sequence, a traceback)."""
    clock, log = _Clock(), []
    a = _FakeLoop("A", clock, [0.0, 60.0], 1, 10.0, log)
    a.requests[1].left = 0
    b = _FakeLoop("B", clock, [50.0], 0, 10.0, log)
    wait_us, trims = serve([a, b], None, _sleep(clock))
    assert log == [("A", 0.0)] and a.done and b.done and wait_us == [0.0, 0.0] and trims == [0, 0]


# ---- the CPU replay ----------------------------------------------------------------------------------------
def _traces(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,150,3\n0.0,140,3\n0.0,130,2\n")
    # B's two requests arrive 2.5 s in: A (three short requests at 0) has finished and idled past the trim delay
    # by then even on a loaded 2-core machine (about 0.4 s alone), so the hand-over does not depend on timing
    b.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,1\n2.5,200,3\n2.5,180,3\n")
    return a, b


def _argv(tmp_path: Path, out: Path, sharing: str = "elastic:trim-delay=0.05s") -> list[str]:
    a, b = _traces(tmp_path)
    # a KV pool of 10 Llama-3.1-8B page groups of 64 KiB pages (640 pages) after both tenants' weights
    memory_util = (WEIGHTS_BYTES + 654 * 65536) / H200_HBM_BYTES
    return ["--device", "cpu", "--sharing", sharing, "--memory-util", f"{memory_util:.6f}", "--page-size", "64KiB",
            "--out", str(out), "--tenant", f"name=a,model=llama-3.1-8b,trace={a}",
            "--tenant", f"name=b,model=qwen2.5-7b,trace={b}"]


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory):
    pytest.importorskip("torch")
    from hwbackend.replay.colocate import main

    tmp = tmp_path_factory.mktemp("colocate")
    out = tmp / "run"
    assert main(_argv(tmp, out)) == 0
    return out


def test_elastic_replay_hands_the_idle_tenants_pages_to_the_other(elastic_run):
    """A takes the whole pool at t=0 (B's first request, alone and without pages, is rejected as the simulator
    rejects it); A idles and is trimmed; B's requests at 2.5 s map A's returned handles into B's ranges."""
    summary = json.loads((elastic_run / "summary.json").read_text())
    a, b = summary["tenants"]
    assert summary["backend"] == "hardware" and summary["sharing"]["mode"] == "elastic"
    assert a["finished"] == 3 and a["trim_unmap_page_groups"] > 0
    requests_b = pd.read_parquet(elastic_run / "tenants" / "b" / "requests.parquet")
    assert (requests_b.loc[requests_b["arrival_at_us"] >= 2.5e6, "status"] == "finished").all()
    # on the CPU every tenant's decoder has 2 layers: a page group is 4 handles; B took at most what A returned
    assert 0 < b["moved_in_pages"] <= a["trim_unmap_page_groups"] * 4
    assert b["policy_moved_in_pages"] > 0          # the policies' pool counts it too (in the models' own pages)
    assert summary["hw_pool_conservation_error"] == 0
    assert summary["hw_pool_free_pages_at_end"] == summary["hw_pool_pages"]
    memory = pd.read_parquet(elastic_run / "memory.parquet")
    assert list(memory.columns) == ["time_s", "a_bytes", "b_bytes"] and memory["time_s"].is_monotonic_increasing
    assert (memory[["a_bytes", "b_bytes"]].sum(axis=1) <= summary["pool_bytes"]).all()


def test_validate_compares_a_colocated_run_tenant_by_tenant(elastic_run, tmp_path, capsys):
    from cli import main

    out = tmp_path / "validation"
    assert main(["validate", "--hw-run", str(elastic_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "elastic sharing, 2 tenants" in printed and "\na (3 requests" in printed and "\nb (3 requests" in printed
    errors = pd.read_csv(out / "errors.csv")
    assert set(errors["tenant"]) == {"a", "b"}
    moved = errors[(errors["metric"] == "pages moved in") & (errors["tenant"] == "b")].iloc[0]
    summary = json.loads((elastic_run / "summary.json").read_text())
    assert moved["hw"] == summary["tenants"][1]["moved_in_pages"]
    assert "## a (" in (out / "validation.md").read_text()


def test_validate_warns_per_tenant_where_the_profile_does_not_cover_its_model(elastic_run, tmp_path, capsys):
    """profiles/h200-engine.json was fitted on Llama-3-8B / 3.1-8B replays (its stored coverage): tenant a
    (Llama-3.1-8B) gets the coverage line alone, tenant b (Qwen2.5-7B) a warning naming its model too."""
    from cli import main

    profile = str(Path(__file__).resolve().parents[1] / "profiles" / "h200-engine.json")
    out = tmp_path / "validation"
    assert main(["validate", "--hw-run", str(elastic_run), "--profile", profile, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    part_a, part_b = printed.split("\na (3 requests")[1].split("\nb (3 requests")
    assert "profile coverage: models" in part_a and "warning" not in part_a.split("|")[0]
    assert "warning: the run's model qwen2.5-7b is not among the profile's models" in part_b
    assert "compute model: in-loop (compute_in_loop of " in part_a
    assert "compute model: roofline (built-in defaults: " in part_b and "not qwen2.5-7b" in part_b
    assert "warning: the run's model qwen2.5-7b" in (out / "validation.md").read_text()


def test_a_broken_colocated_summary_is_one_message(elastic_run, tmp_path, capsys):
    import shutil

    from cli import main

    broken = tmp_path / "broken"
    shutil.copytree(elastic_run, broken)
    summary = json.loads((broken / "summary.json").read_text())
    del summary["tenants"][1]["dir"]
    (broken / "summary.json").write_text(json.dumps(summary))
    assert main(["validate", "--hw-run", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "summary.json" in err and "tenants[1]" in err and "Traceback" not in err


@pytest.mark.parametrize("text", ['{"backend": "hardware", "tenants": [', "", "[1, 2]"])
def test_an_unreadable_colocated_summary_is_named(elastic_run, tmp_path, capsys, text):
    """A co-located run's summary.json that is not a JSON object is the message (it was blamed on a missing
    requests.parquet: the folder fell through to the single-run loader)."""
    import shutil

    from cli import main

    broken = tmp_path / "broken"
    shutil.copytree(elastic_run, broken)
    (broken / "summary.json").write_text(text)
    assert main(["validate", "--hw-run", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken / 'summary.json'}:" in err and "requests.parquet" not in err and "Traceback" not in err


def test_one_tenant_of_a_colocated_run_is_refused_alone(elastic_run, capsys):
    """Validated alone, a tenant was simulated without the other tenant's compute and memory (TTFT -99%)."""
    from cli import main

    assert main(["validate", "--hw-run", str(elastic_run / "tenants" / "a")]) == 2
    err = capsys.readouterr().err
    assert "is tenant 'a' of the co-located run" in err and f"kvsim validate --hw-run {elastic_run.resolve()}" in err


def test_tenant_folders_not_in_the_summary_are_named(elastic_run, tmp_path, capsys):
    """A tenant folder on disk that summary.json does not list was silently left out of the validation: one
    warning line names it (and validation.md says so); the listed tenants are validated as before."""
    import shutil

    from cli import main

    run = tmp_path / "run"
    shutil.copytree(elastic_run, run)
    shutil.copytree(run / "tenants" / "b", run / "tenants" / "c")
    assert main(["validate", "--hw-run", str(run), "--out", str(tmp_path / "v")]) == 0
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if "tenants/c" in line]
    assert line == ("kvsim: warning: tenant folder tenants/c on disk is not listed in the run's summary.json (field "
                    "tenants), so not simulated or validated")
    assert "elastic sharing, 2 tenants" in captured.out
    assert "tenants/c" in (tmp_path / "v" / "validation.md").read_text()
    assert main(["validate", "--hw-run", str(elastic_run)]) == 0      # every folder listed: no warning
    assert "not listed" not in capsys.readouterr().err


def test_the_colocated_table_names_each_figure_once(elastic_run, tmp_path):
    """The co-located table showed "peak mapped memory" and "peak mapped KV" (two rows, identical in the committed
    runs): they are two quantities (the iteration records' largest mapped count; the page groups held with those
    in flight, the pool's running peak or the largest memory sample), so each is named once and by what it is."""
    from cli import main

    assert main(["validate", "--hw-run", str(elastic_run), "--out", str(tmp_path / "v"), "--quiet"]) == 0
    errors = pd.read_csv(tmp_path / "v" / "errors.csv")
    for _, rows in errors.groupby("tenant"):
        assert not rows.duplicated(["metric", "stat"]).any()
        assert {"peak mapped memory", "peak held KV (mapped + in flight)"} <= set(rows["metric"])
        assert "peak mapped KV" not in set(rows["metric"])


def _set(path: list, value):
    def change(summary):
        target = summary
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set(["sharing", "split"], 5), "field sharing.split must be null or a list of shares, got 5"),
    (_set(["sharing", "split"], [1, 2, 3]), "field sharing.split has 3 shares for 2 tenants"),
    (_set(["sharing", "trim_delay_us"], "abc"), "field sharing.trim_delay_us must be a number, got 'abc'"),
    (_set(["sharing", "trim_delay_us"], -5), "field sharing.trim_delay_us=-5 must lie in [0, inf]"),
    (_set(["sharing", "compute"], "isolated"), "field sharing.compute='isolated'"),     # was simulated as given
    (_set(["tenants"], []), "field 'tenants' is empty"),
    (_set(["tenants", 0, "dir"], 5), "field tenants[0].dir must be a non-empty string, got 5"),
    (_set(["tenants", 1, "tenant"], "a"), "field tenants[1].tenant='a' names a tenant twice"),
    (_set(["tenants", 0, "floor_frac"], None), "field tenants[0].floor_frac must be a number, got None"),
    (_set(["tenants", 0, "ceiling_frac"], 0), "field tenants[0].ceiling_frac=0 must lie in (0, 1]"),
    (_set(["tenants", 1, "moved_in_pages"], "x"), "field tenants[1].moved_in_pages must be a number, got 'x'"),
    (_set(["tenants", 1, "gpu_wait_s"], [1]), "field tenants[1].gpu_wait_s must be a number, got [1]"),
    (_set(["tenants", 1, "dir"], "tenants/a"), "field tenants[1].dir='tenants/a' is also tenant 'a''s folder"),
])
def test_a_corrupt_colocated_summary_field_is_one_message(elastic_run, tmp_path, capsys, change, message):
    """Each was a traceback (TypeError), a message without file or field (float()'s), or simulated as given."""
    import shutil

    from cli import main

    broken = tmp_path / "broken"
    shutil.copytree(elastic_run, broken)
    summary = json.loads((broken / "summary.json").read_text())
    change(summary)
    (broken / "summary.json").write_text(json.dumps(summary))
    assert main(["validate", "--hw-run", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken / 'summary.json'}: {message}" in err and "Traceback" not in err


def test_a_colocated_tenant_without_its_records_is_one_message(elastic_run, tmp_path, capsys):
    import shutil

    from cli import main

    broken = tmp_path / "broken"
    shutil.copytree(elastic_run, broken)
    (broken / "tenants" / "b" / "iterations.parquet").unlink()
    assert main(["validate", "--hw-run", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "tenants/b: not a kvsim run directory (iterations.parquet is missing)" in err and "Traceback" not in err


@pytest.mark.parametrize("change, message", [
    (lambda argv: argv + ["--compute", "isolated"], "--compute isolated"),
    (lambda argv: [x.replace("name=b,", "name=b,sleep-after=5s,") for x in argv], "sleep-after"),
    (lambda argv: [x.replace("elastic:trim-delay=0.05s", "both") for x in argv], "--sharing both"),
    (lambda argv: [x for i, x in enumerate(argv) if not (x == "--tenant" or (i and argv[i - 1] == "--tenant"))],
     "no --tenant"),
    # the replay's loop has no prefix cache (a static run failed mid-replay: "slots [0] were not prepared by
    # admit_prefix()"); elastic sharing refused it only inside the replay, with a traceback
    (lambda argv: [x.replace("name=b,", "name=b,policy=vattention:prefix=on,") for x in argv],
     "prefix_caching True: the hardware replay implements prefix_caching=False only"),
    (lambda argv: [x.replace("name=b,", "name=b,policy=vattention:prefix=on,").replace(
        "elastic:trim-delay=0.05s", "static") for x in argv], "prefix_caching True"),
    (lambda argv: [x.replace("name=b,model=qwen2.5-7b", "name=b,model=models/gpt-oss-20b.json,policy="
                             "vattention:window=unmap") for x in argv], "window_alloc 'unmap'"),
    # weights that leave no KV pool: was a traceback from inside the replay
    (lambda argv: [("0.2" if i and argv[i - 1] == "--memory-util" else x) for i, x in enumerate(argv)],
     "leave no KV memory on h200 at --memory-util 0.2 (memory_util_frac)"),
    (lambda argv: [x.replace("name=b,", "name=../b,") for x in argv], "name='../b'"),
])
def test_what_the_replay_does_not_implement_is_refused_before_it_starts(tmp_path, capsys, change, message):
    pytest.importorskip("torch")
    from hwbackend.replay.colocate import main

    out = tmp_path / "run"
    assert main(change(_argv(tmp_path, out))) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (out / "summary.json").exists() and not (tmp_path / "b").exists()


@pytest.mark.gpu
def test_elastic_replay_on_the_gpu_hands_pages_over(tmp_path):
    """The CPU scenario on CUDA with real VMM calls and engine kernels (2-layer decoders of each model's KV head
    shape): every request of A and B's late ones finish, B maps A's trimmed handles, the pool is conserved. A
    pool this short reclaims slot 0, which is what broke Triton's pointer check on the H200 before
    ``pin_base_pages`` (2026-12-02)."""
    pytest.importorskip("triton")
    from analysis.colocate import build_tenants, sharing_of
    from hwbackend.replay.colocate import build_parser, replay_colocated

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"      # 2 MiB pages (the real driver's granularity): 1,024 /
    a.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4000,3\n0.0,3800,3\n0.0,3500,2\n")
    b.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,1\n2.5,5000,3\n2.5,4000,3\n")  # 2,048 tokens
    memory_util = (WEIGHTS_BYTES + 654 * 2**21) / H200_HBM_BYTES    # 10 Llama page groups of 2 MiB pages
    args = build_parser().parse_args(["--sharing", "elastic:trim-delay=0.05s", "--memory-util", f"{memory_util:.6f}",
                                      "--out", str(tmp_path / "run"), "--tenant", f"name=a,model=llama-3.1-8b,trace={a}",
                                      "--tenant", f"name=b,model=qwen2.5-7b,trace={b}"])
    tenants = build_tenants(args)
    run = replay_colocated(tenants, sharing_of(args, len(tenants)), "cuda:0", "engine", warmup_s=0.0,
                           tiny_models=True)
    a, b = (output.requests_frame() for output in run.outputs)
    assert (a["status"] == "finished").all()
    assert (b.loc[b["arrival_at_us"] >= 2.5e6, "status"] == "finished").all()
    assert 0 < run.stats[1]["moved_in_pages"] <= run.stats[0]["trim_unmap_page_groups"] * 4   # 4 sub-tensors
    assert run.extra["hw_pool_conservation_error"] == 0
    assert all(meta.get("anchor_slot") == 0 for meta in run.metas)
