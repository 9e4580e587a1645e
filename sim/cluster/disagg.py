"""Disaggregated prefill and decode: P prefill instances and D decode instances co-simulated in one SimPy
environment, the KV cache moving between them over a modelled link (:mod:`sim.timing.kvlink`).

Each instance is a full :class:`sim.core.engine.Simulator` with its own configuration (memory policy, page pool,
tensor-parallel degree, scheduler, seed) and its own KV pool. A request goes through (times in us)::

    arrival ── router: least-outstanding prefill instance ──► prefill instance: queue, admission, chunked
    prefill of the prompt with output_tokens = 1 semantics (the prefill emits the first token, as in Splitwise
    and DistServe); its KV stays on the prefill instance
        ── at prefill end (pull, the default): the router picks the least-outstanding decode instance and hands
           the request over (Simulator.submit(computed_tokens=prompt)) ──► decode instance: queue, admission
           maps (allocates) the prompt's pages ── the transfer starts when the admission iteration's
           synchronous phase (page maps) ends, the links are free ──► KV lands: the prefill instance frees its
           copy; the decode instance starts decoding the remaining output - 1 tokens
        ── with layer-wise streaming: the request is handed over to the least-outstanding decode instance when
           its prefill starts (Splitwise assigns the decode machine up front and sends each layer's KV as soon as
           it is computed, Patel et al. ISCA'24 sections 4.2-4.3); the decode instance maps its pages when it
           admits it, possibly before the prefill ends, and takes the KV layer by layer as each chunk of the
           prefill computes it (:func:`sim.timing.kvlink.streamed_finish_us`); its pages are held from admission on

A request decodes only after its KV has landed: until then it holds its slot and pages on the decode instance
but is not in the running set (vLLM's disaggregated decode keeps such requests in WAITING_FOR_REMOTE_KVS in the
same way). Time to first token counts the transfer: the first token reaches the user with the hand-over,
when the KV has landed (vLLM's disaggregated-serving proxy and NVIDIA Dynamo stream tokens from the decode
worker); the column ``prefill_done_at_us`` holds when the prefill computed it. A request with one output token
finishes on its prefill instance and transfers nothing.

Transfers use ``min(tp_prefill, tp_decode)`` links in parallel (one per GPU; under MLA every decode GPU receives the
whole latent, ``tp_decode`` copies: :attr:`DisaggConfig.link_share`); a prefill instance's outgoing
link and a decode instance's incoming link carry one transfer at a time (FIFO in the order transfers are
started); the bytes are the prompt's KV for the whole model, ``prompt_tokens * kv_bytes_per_token(tp=1)``, or,
with window-aware allocation on the decode role, what its layer groups hold (:meth:`DisaggConfig.kv_transfer_bytes`).

Preemption inside an instance is the instance's own (recompute or swap); a decode instance that preempts a
landed request by recompute re-prefills it locally (as a co-located engine would). Prefix caching is not
modelled in disaggregated runs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import simpy

from sim.cluster.disagg_instances import DecodeInstance, PrefillInstance
from sim.cluster.disagg_summary import disagg_run_result, instance_figures, summarize_disagg  # noqa: F401  (re-exported)
from sim.core import runner
from sim.core.collector import quiet_collector
from sim.setup.config import ConfigError, SimConfig
from sim.core.engine import ARRIVAL_TICK_US, ARRIVAL_TICKS_PER_S
from sim.timing.kvlink import LINKS, KvLink, streamed_finish_us
from sim.core.lifecycle import unservable_reason
from sim.results.records import REQUEST_COLUMNS, tbt_stats_us
from sim.core.request import Request
from sim.units import US_PER_S

ROLES = ("prefill", "decode")
KV_STREAM_MODES = ("off", "layerwise")

DISAGG_REQUEST_COLUMNS = REQUEST_COLUMNS + (
    "prefill_instance", "decode_instance", "prefill_done_at_us", "decode_admitted_at_us", "kv_mapped_at_us",
    "kv_transfer_start_at_us", "kv_landed_at_us", "kv_transfer_bytes", "kv_transfer_us", "kv_handover_us")
"""Per-request columns of a disaggregated run: the co-located ones (``first_token_at_us`` is when the KV
landed, plus the engine's front-end cost ``frontend_overhead_us`` as in a co-located run, ``first_scheduled_at_us`` / ``sched_delay_us`` refer to the prefill instance), then the instance
indices (-1: none), when the prefill emitted the first token, when the decode instance admitted the request
and its pages were mapped, when the transfer started and landed, its bytes and duration
(``landed - start``, latency included), and the hand-over time ``landed - prefill done`` (decode queueing,
mapping and the part of the transfer not overlapped with the prefill)."""

_PD = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


class DisaggStallError(RuntimeError):
    """The deployment stopped with requests unfinished and nothing left to happen: a cycle of full pools (with
    layer-wise streaming, decode pages held for prefills that wait for prefill pages held by KV waiting for
    those decode pages). A modelled outcome of the deployment at this load, not a simulator fault; the message
    names the state (and, with streaming, the field ``kv_stream`` to change: :attr:`fields`)."""

    fields = ("kv_stream",)


def parse_pd(text: str) -> tuple[int, int]:
    """``"1:2"`` -> ``(1, 2)``: prefill and decode instance counts.

    Raises:
        ConfigError: one line naming the field ``pd`` and the value.
    """
    match = _PD.match(str(text))
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ConfigError(f"pd={text!r}: expected P:D, prefill and decode instances, whole numbers >= 1, e.g. 1:2",
                          "pd")
    return int(match.group(1)), int(match.group(2))


def parse_kv_stream(text: str) -> bool:
    """``off`` -> False, ``layerwise`` -> True.

    Raises:
        ConfigError: naming the field ``kv_stream`` and the value.
    """
    value = str(text).strip().lower()
    if value not in KV_STREAM_MODES:
        raise ConfigError(f"kv_stream={text!r}: choose one of {', '.join(KV_STREAM_MODES)}", "kv_stream")
    return value == "layerwise"


@dataclass(frozen=True)
class DisaggConfig:
    """A disaggregated deployment: ``num_prefill`` instances of ``prefill`` and ``num_decode`` of ``decode``.

    Attributes:
        prefill / decode: each role's instance configuration (policy, pool, tp, scheduler, ...); instance i of
            the prefill role runs with seed ``prefill.seed + i``, decode instance j with ``decode.seed + P + j``.
        num_prefill / num_decode: P and D.
        link: the KV link (:mod:`sim.timing.kvlink`).
        streaming: layer-wise streaming of the KV during the prefill (else the transfer follows the prefill).

    Raises:
        ConfigError: a role that is not a SimConfig, counts that are not whole numbers >= 1, a link that is not
            a KvLink, roles serving different models or slot lengths, pipeline parallelism, prefix caching.
    """

    prefill: SimConfig
    decode: SimConfig
    num_prefill: int = 1
    num_decode: int = 1
    link: KvLink = LINKS["ib"]
    streaming: bool = False

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            if not isinstance(getattr(self, name), SimConfig):
                raise ConfigError(f"{name}: expected a SimConfig (the role's instance configuration), got "
                                  f"{getattr(self, name)!r}", name)
        for name in ("num_prefill", "num_decode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}={value!r}: expected a whole number of instances >= 1", "pd")
        if not isinstance(self.link, KvLink):
            raise ConfigError(f"link={self.link!r}: expected a KvLink (sim.timing.kvlink.LINKS[name] or "
                              "parse_kv_link('50GB/s,5us'))", "kv_link")
        if not isinstance(self.streaming, bool):
            raise ConfigError(f"streaming={self.streaming!r}: expected True or False", "kv_stream")
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ConfigError(f"pd={self.num_prefill}:{self.num_decode}: both counts must be >= 1 (num_prefill, "
                              "num_decode)", "pd")
        if self.prefill.model != self.decode.model:
            raise ConfigError(f"prefill and decode instances must serve one model, got {self.prefill.model} and "
                              f"{self.decode.model}")
        if self.prefill.slot_max_tokens != self.decode.slot_max_tokens:
            raise ConfigError("prefill and decode instances must have one slot length (max_context_tokens)",
                              "max_context_tokens")
        if getattr(self.prefill, "pp", 1) > 1 or getattr(self.decode, "pp", 1) > 1:
            raise ConfigError("pd: pipeline parallelism (pp) is not modelled in disaggregated deployments; use "
                              "tensor parallelism per role (prefill_tp / decode_tp)", "pd", "pp", "prefill_tp",
                              "decode_tp")
        if self.prefill.prefix_caching or self.decode.prefix_caching:
            engine = self.prefill.engine or self.decode.engine
            why = (f"the engine preset {engine} turns it on: add prefix=off to the policy (e.g. paged:prefix=off)"
                   if engine else "leave prefix=on out")
            raise ConfigError(f"pd: prefix caching is not modelled in disaggregated runs; {why}", "pd")

    @property
    def pd(self) -> str:
        return f"{self.num_prefill}:{self.num_decode}"

    @property
    def prefill_gpus(self) -> int:
        return self.num_prefill * self.prefill.tp

    @property
    def decode_gpus(self) -> int:
        return self.num_decode * self.decode.tp

    @property
    def gpus(self) -> int:
        """GPUs of the whole deployment: ``P * tp_prefill + D * tp_decode``."""
        return self.prefill_gpus + self.decode_gpus

    @property
    def links(self) -> int:
        """Parallel links of one transfer: ``min(tp_prefill, tp_decode)`` (one per GPU)."""
        return min(self.prefill.tp, self.decode.tp)

    @property
    def link_share(self) -> float:
        """The transfer's KV bytes moved per link, over the prompt's bytes / links: 1, as each decode GPU needs its
        heads' share; under MLA ``tp_decode``, as every GPU holds the whole latent (``kv_bytes_per_token`` is the
        same at any tp), so each decode GPU needs a full copy (DeepSeek-V3 at tp 8 moved its KV 8x too fast:
        helper-58)."""
        return float(self.decode.tp) if self.prefill.model_spec.uses_mla else 1.0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over the whole model (all layers, all KV heads, K and V)."""
        return self.prefill.model_spec.kv_bytes_per_token(1)

    def kv_transfer_bytes(self, prompt_tokens: int) -> int:
        """Bytes one request's hand-over moves: the prompt's KV over the whole model, ``prompt_tokens x
        kv_bytes_per_token``; with window-aware allocation on the decode role (a hybrid model), what its layer
        groups hold after the prompt (:func:`sim.memory.layer_groups.kv_bytes_for_tokens` at tp 1: sliding and
        chunked layers their window, linear layers their state), the blocks vLLM's hybrid KV-cache manager keeps
        for the request and its KV connector sends."""
        if self.decode.hybrid_alloc:
            from sim.memory.layer_groups import kv_bytes_for_tokens, layer_groups
            return kv_bytes_for_tokens(layer_groups(self.decode.model_spec, 1), prompt_tokens)
        return prompt_tokens * self.kv_bytes_per_token

    @property
    def label(self) -> str:
        """``1:2 prefill vattention 2 MiB async (tp 1) | decode ... | ib``."""
        return (f"P:D {self.pd}, prefill {self.prefill.label} (tp {self.prefill.tp}), decode {self.decode.label} "
                f"(tp {self.decode.tp}), kv link {self.link.name}" + (", layer-wise" if self.streaming else ""))

    @property
    def seed(self) -> int:
        return self.prefill.seed

    @property
    def slot_max_tokens(self) -> int:
        return self.prefill.slot_max_tokens

    def to_dict(self) -> dict:
        """For ``config.json``: the deployment, the link, and each role's :meth:`SimConfig.to_dict`."""
        return {"disaggregated": True, "pd": self.pd, "num_prefill": self.num_prefill, "num_decode": self.num_decode,
                "gpus": self.gpus, "model": self.prefill.model, "gpu": self.prefill.gpu,
                "kv_link": {"name": self.link.name, "bandwidth_bytes_per_s": self.link.bandwidth_bytes_per_s,
                            "latency_us": self.link.latency_us, "source": self.link.source, "links": self.links,
                            "link_share": self.link_share},
                "kv_stream": "layerwise" if self.streaming else "off", "kv_bytes_per_token": self.kv_bytes_per_token,
                "label": self.label, "seed": self.seed, "slot_max_tokens": self.slot_max_tokens,
                "prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}


class _Handover:
    """One request's path through the deployment (times in us, NaN until known)."""

    __slots__ = ("request_id", "arrival_us", "prompt", "output", "prefill_index", "decode_index", "prefill_req",
                 "decode_req", "prefill_done_us", "mapped_us", "start_us", "landed_us", "bytes", "reject_reason")

    def __init__(self, request_id: int, arrival_us: float, prompt: int, output: int):
        self.request_id, self.arrival_us, self.prompt, self.output = request_id, arrival_us, prompt, output
        self.prefill_index = self.decode_index = -1
        self.prefill_req: Request | None = None
        self.decode_req: Request | None = None
        self.prefill_done_us = self.mapped_us = self.start_us = self.landed_us = math.nan
        self.bytes = 0
        self.reject_reason = ""


@dataclass
class DisaggRun:
    """A finished disaggregated run.

    Attributes:
        config: the deployment.
        requests: per-request table (:data:`DISAGG_REQUEST_COLUMNS`, times in us on the trace's clock).
        iterations: every instance's iteration table with ``role`` and ``instance`` columns.
        summary: the run summary (:func:`summarize_disagg`).
        instances: each instance's own :class:`analysis.results.RunResult`, prefill instances first.
    """

    config: DisaggConfig
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    instances: list = field(default_factory=list, repr=False)


class DisaggCluster:
    """P prefill and D decode instances in one SimPy environment, a router and the KV transfers.

    Args:
        config: the deployment.
        trace: canonical table, ``request_id`` = row number, sorted by arrival, every request within the slot
            length.
        profile_path: calibration profile applied to every instance (:func:`sim.core.runner.load_models`).
        models: ``role -> (vmm, compute)`` to use instead of the profile's (tests: constant models).

    Raises:
        ValueError: request ids that are not row numbers.
    """

    def __init__(self, config: DisaggConfig, trace: pd.DataFrame, profile_path: str | None = None,
                 models: dict | None = None):
        if not np.array_equal(trace["request_id"].to_numpy(), np.arange(len(trace))):
            raise ValueError("a disaggregated run needs request ids 0..n-1 in arrival order (renumber the trace)")
        self.config, self.trace, self.profile_path = config, trace, profile_path
        self.env = simpy.Environment()
        self.meta: list[dict] = []
        self.prefills = [self._instance(PrefillInstance, i, replace(config.prefill, seed=config.seed + i), models,
                                        on_prefilled=self._prefilled, record_chunks=config.streaming,
                                        on_started=self._started if config.streaming else None,
                                        on_rejected=self._rejected)
                         for i in range(config.num_prefill)]
        self.decodes = [self._instance(DecodeInstance, j, replace(config.decode, seed=config.decode.seed
                                                                   + config.num_prefill + j), models,
                                       on_mapped=self._mapped) for j in range(config.num_decode)]
        self.sender_free_us = [0.0] * config.num_prefill
        self.receiver_free_us = [0.0] * config.num_decode
        self.handovers: list[_Handover] = []
        self._by_prefill: dict[Request, _Handover] = {}
        self._by_decode: dict[Request, _Handover] = {}
        self.pending = 0                       # handed over, not landed (nor cancelled)
        self._all_landed: simpy.Event | None = None
        self._bytes_per_us = config.link.bytes_per_us(config.links) / config.link_share
        self._layers = config.prefill.model_spec.num_layers

    def _instance(self, cls, index: int, config: SimConfig, models: dict | None, **hooks):
        config = runner.profile_config_overrides(config, self.profile_path)
        role = cls.role
        if models is not None:
            vmm, compute = models[role]
        else:
            vmm, compute = runner.load_models(config, self.profile_path)
        instance = cls(index, config, self.env, vmm, compute, **hooks)
        instance.open_arrivals()
        instance.start()
        self.meta.append({**config.to_dict(), "role": role, "instance": index,
                          "vmm_latency_source": getattr(vmm, "source", "")})
        return instance

    # ---- the run ---------------------------------------------------------------------------------------
    def run(self) -> DisaggRun:
        """Simulate to the last request and build the result.

        Raises:
            DisaggStallError: when the environment runs out of events with requests unfinished (a cycle of full
                pools between instances).
        """
        router = self.env.process(self._router())
        self.env.process(self._closer(router))
        with quiet_collector():
            self.env.run()
        unfinished = [h.request_id for h in self.handovers if not self._resolved(h)]
        if unfinished or len(self.handovers) != len(self.trace):
            held = sum(len(instance.held) for instance in self.prefills)
            waiting = sum(len(instance.in_transfer) for instance in self.decodes)
            raise DisaggStallError(
                f"the disaggregated deployment {self.config.pd} stalled at t={self.env.now / US_PER_S:.3f} s with "
                f"{len(unfinished)} requests unfinished (first: {unfinished[:5]}): {held} prefill slots hold KV "
                f"waiting for decode pages, {waiting} decode slots wait for KV"
                + ("; layer-wise streaming holds decode pages while prefills wait: try kv_stream=off or larger "
                   "pools" if self.config.streaming else ""))
        return self._result()

    @staticmethod
    def _resolved(handover: _Handover) -> bool:
        """Whether the request reached its end: rejected, or finished on its last instance."""
        if handover.reject_reason:
            return True
        prefill = handover.prefill_req
        if prefill is None or prefill.status not in ("finished", "rejected"):
            return False
        if prefill.status == "rejected" or handover.output == 1:
            return True
        return handover.decode_req is not None and handover.decode_req.status in ("finished", "rejected")

    def _router(self):
        env, trace = self.env, self.trace
        arrivals_us = np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S) * ARRIVAL_TICK_US
        prefill_config, decode_config = self.prefills[0].policy.config, self.decodes[0].policy.config
        assigned_p = [0] * len(self.prefills)
        rows = zip(arrivals_us, trace["request_id"], trace["prompt_tokens"], trace["output_tokens"])
        for arrival_us, request_id, prompt, output in rows:
            for instance in self.prefills:     # no instance fast-forwards past an arrival it might receive
                instance.arrival_horizon_us = float(arrival_us)
            if arrival_us > env.now:
                yield env.timeout(arrival_us - env.now)
            handover = _Handover(int(request_id), float(arrival_us), int(prompt), int(output))
            self.handovers.append(handover)
            reason = unservable_reason(prefill_config, handover.prompt) or (
                unservable_reason(decode_config, handover.prompt + handover.output - 1) if handover.output > 1 else "")
            if reason:       # never fits an instance of one role: rejected before any work
                handover.reject_reason = reason
                continue
            p = _least_outstanding(self.prefills, assigned_p)
            handover.prefill_index = p
            handover.prefill_req = self.prefills[p].submit(handover.request_id, handover.prompt, 1)
            self._by_prefill[handover.prefill_req] = handover
        for instance in self.prefills:
            instance.arrival_horizon_us = float("inf")

    def _hand_over(self, handover: _Handover) -> None:
        d = _least_outstanding(self.decodes, self._decode_assigned)
        handover.decode_index = d
        handover.decode_req = self.decodes[d].hand_over(handover.request_id, handover.prompt, handover.output)
        self._by_decode[handover.decode_req] = handover
        self.pending += 1

    @property
    def _decode_assigned(self) -> list[int]:
        return [len(instance.requests) for instance in self.decodes]

    def _started(self, instance: PrefillInstance, request: Request) -> None:
        """Streaming: the prefill starts; hand the request over now so that the decode side maps its pages
        and takes the KV layer by layer as the prefill computes it."""
        handover = self._by_prefill[request]
        if handover.output > 1 and handover.decode_req is None:
            self._hand_over(handover)

    def _rejected(self, instance: PrefillInstance, request: Request) -> None:
        """A prefill rejected at run time: a decode instance already holding the request drops it."""
        handover = self._by_prefill[request]
        if handover.decode_req is not None and handover.decode_req.status not in ("finished", "rejected"):
            self.decodes[handover.decode_index].cancel(handover.decode_req, request.reject_reason)
            self._settled()

    def _prefilled(self, instance: PrefillInstance, request: Request) -> bool:
        handover = self._by_prefill[request]
        handover.prefill_done_us = self.env.now
        if handover.output == 1:
            return False
        if not self.config.streaming:
            self._hand_over(handover)
        elif not math.isnan(handover.mapped_us):
            self._start_transfer(handover)
        return True

    def _mapped(self, instance: DecodeInstance, request: Request) -> None:
        handover = self._by_decode[request]
        handover.mapped_us = self.env.now
        if not math.isnan(handover.prefill_done_us):
            self._start_transfer(handover)

    def _start_transfer(self, handover: _Handover) -> None:
        """Both ends are ready (pages mapped on the decode side; the prefill done, or streaming): reserve the
        links and schedule the landing."""
        p, d = handover.prefill_index, handover.decode_index
        handover.bytes = self.config.kv_transfer_bytes(handover.prompt)
        ready_us = max(handover.mapped_us, self.sender_free_us[p], self.receiver_free_us[d])
        if self.config.streaming:
            chunks = self.prefills[p].chunks.pop(handover.prefill_req, [])
            per_token = (self.config.kv_bytes_per_token if not self.config.decode.hybrid_alloc
                         else handover.bytes / handover.prompt)      # a hybrid model's bytes spread over its prompt
            first_us, last_us = streamed_finish_us(ready_us, chunks, per_token, self._layers, self._bytes_per_us)
        else:
            first_us, last_us = ready_us, ready_us + handover.bytes / self._bytes_per_us
        self.sender_free_us[p] = self.receiver_free_us[d] = last_us
        handover.start_us, handover.landed_us = first_us, last_us + self.config.link.latency_us
        self.prefills[p].kv_bytes_sent += handover.bytes
        self.decodes[d].kv_bytes_received += handover.bytes
        self.env.process(self._land(handover))

    def _land(self, handover: _Handover):
        yield self.env.timeout(handover.landed_us - self.env.now)
        self.prefills[handover.prefill_index].free_held(handover.prefill_req)
        self.decodes[handover.decode_index].land(handover.decode_req)
        self._settled()

    def _settled(self) -> None:
        self.pending -= 1
        if not self.pending and self._all_landed is not None and not self._all_landed.triggered:
            self._all_landed.succeed()

    def _closer(self, router: simpy.Process):
        """Close the prefill instances once every request is routed; close the decode instances once every
        prefill instance has ended and every hand-over has landed (or was cancelled)."""
        yield router
        for instance in self.prefills:
            instance.close()
        yield simpy.AllOf(self.env, [instance.process for instance in self.prefills])
        while self.pending:
            self._all_landed = self.env.event()
            yield self._all_landed
        for instance in self.decodes:
            instance.close()

    # ---- results ---------------------------------------------------------------------------------------
    def _result(self) -> DisaggRun:
        from sim.results.summary import build_result

        instances = []
        for meta, instance in zip(self.meta, [*self.prefills, *self.decodes]):
            meta = {**meta, "trace_source": f"{self.trace.attrs.get('source', 'trace')} | {meta['role']} "
                                            f"{meta['instance']}"}
            instances.append(build_result(instance.output(), meta))
        requests = self._requests_table()
        frames = [result.iterations.assign(role=instance.role, instance=instance.index)
                  for result, instance in zip(instances, [*self.prefills, *self.decodes])]
        iterations = pd.concat(frames, ignore_index=True)
        # decode instances step every iteration (no fast-forwarded runs): tbt_us holds every gap
        decode_gaps_us = np.concatenate([np.asarray(instance.tbt_us, dtype=float) for instance in self.decodes])
        summary = summarize_disagg(self.config, requests, iterations, instances, tbt_stats_us(decode_gaps_us, []),
                                   [*self.prefills, *self.decodes])
        return DisaggRun(self.config, requests, iterations, summary, instances)

    def _requests_table(self) -> pd.DataFrame:
        rows = []
        nan = math.nan
        # the engine's front-end cost (tokenising, detokenising: SimConfig.frontend_overhead_us), once per request as
        # a co-located run's records add it (sim.core.request.Request.record); the proxy in front of both roles pays it
        overhead_us = self.config.prefill.frontend_overhead_us
        for h in self.handovers:
            pr, dr = h.prefill_req, h.decode_req
            status, reason = "finished", h.reject_reason
            first = completion = scheduled = decode_admitted = nan
            preemptions = recomputed = 0
            slot = -1
            if reason:
                status = "rejected"
            else:
                preemptions, recomputed, scheduled = pr.preemptions, pr.recomputed_tokens, pr.first_scheduled_at_us
                slot = pr.last_slot
                if pr.status == "rejected":
                    status, reason = "rejected", pr.reject_reason
                elif h.output == 1:
                    first, completion = pr.first_token_at_us, pr.completion_at_us
                if dr is not None:
                    preemptions += dr.preemptions
                    recomputed += dr.recomputed_tokens
                    decode_admitted, slot = dr.first_scheduled_at_us, dr.last_slot
                    if status == "finished":
                        if dr.status == "finished":
                            first, completion = h.landed_us, dr.completion_at_us
                        else:
                            status, reason = "rejected", dr.reject_reason
            if overhead_us and status == "finished":
                first, completion = first + overhead_us, completion + overhead_us
            ttft = first - h.arrival_us
            tpot = (completion - first) / (h.output - 1) if h.output > 1 else nan
            rows.append((h.request_id, h.arrival_us, h.prompt, h.output, first, completion, ttft, tpot,
                         completion - h.arrival_us, preemptions, slot, status, 0, scheduled, scheduled - h.arrival_us,
                         0, recomputed, reason, h.prefill_index, h.decode_index, h.prefill_done_us, decode_admitted,
                         h.mapped_us, h.start_us, h.landed_us, h.bytes, h.landed_us - h.start_us,
                         h.landed_us - h.prefill_done_us))
        table = pd.DataFrame.from_records(rows, columns=list(DISAGG_REQUEST_COLUMNS))
        for name in ("first_token_at_us", "completion_at_us", "ttft_us", "tpot_us", "e2e_us", "first_scheduled_at_us",
                     "sched_delay_us", "prefill_done_at_us", "decode_admitted_at_us", "kv_mapped_at_us",
                     "kv_transfer_start_at_us", "kv_landed_at_us", "kv_transfer_us", "kv_handover_us"):
            table[name] = table[name].astype(float)
        return table


def _least_outstanding(instances: list, assigned: list[int]) -> int:
    """The instance with the fewest outstanding requests; ties: fewer assigned so far, then the lower index
    (the rule of :mod:`sim.cluster.routing`)."""
    choice = min(range(len(instances)), key=lambda i: (instances[i].outstanding, assigned[i], i))
    assigned[choice] += 1
    return choice


def run_disagg(config: DisaggConfig, trace: pd.DataFrame, profile_path: str | None = None,
               models: dict | None = None) -> DisaggRun:
    """Simulate ``trace`` on the deployment ``config`` (see :class:`DisaggCluster`)."""
    return DisaggCluster(config, trace, profile_path, models).run()


__all__ = ["DISAGG_REQUEST_COLUMNS", "DecodeInstance", "DisaggCluster", "DisaggConfig", "DisaggRun", "DisaggStallError", "KV_STREAM_MODES",
           "PrefillInstance", "ROLES", "disagg_run_result", "instance_figures", "parse_kv_stream", "parse_pd",
           "run_disagg", "summarize_disagg"]
