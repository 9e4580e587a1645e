"""Pipeline parallelism as a compute-model term: the time of one simulated iteration with ``pp`` stages.

The simulator runs one scheduler loop; with ``pp`` stages one simulated iteration is one *round*: every running
sequence advances by its scheduled tokens once. vLLM keeps ``pp`` batches in flight (V0: ``pp`` virtual engines,
each with its own scheduler and ``1/pp`` of the KV blocks, ``vllm/core/scheduler.py``; V1: a batch queue of
``max_concurrent_batches = pp`` over one KV pool, ``vllm/v1/engine/core.py`` ``step_with_batch_queue``); Vidur
admits up to ``num_pipeline_stages`` batches per replica (``base_replica_scheduler.on_schedule``) and runs one
batch per stage at a time (``ReplicaStageScheduler``). So the round's batch is split into ``m`` micro-batches,
``m = min(pp, max(1, S))`` with ``S`` the sequences that emit a token (each micro-batch holds ``1/m`` of every
term of the batch shape), and for a micro-batch ``b = batch / m``::

    t_s(b)    = roofline of stage s on b (its layers' linear, attention and TP all-reduce terms; the LM head and
                logits on the last stage only; no fixed overhead)              (RooflineComputeModel)
    p2p(b)    = 2 T_b h P_act / interconnect           (hidden states and residual sent to the next stage,
                                                        vLLM IntermediateTensors; bandwidth only)
    chain     = sum_s t_s(b) + (pp - 1) p2p(b)         (one micro-batch through every stage: its latency)
    busy      = m * max_s t_s(b)                       (the slowest stage serves all m micro-batches)
    round_us  = max(chain, busy) + overhead_us (decode_overhead_us for a graphed decode round) + wave term

In steady state with ``m = pp`` equal stages the round is ``pp t(b)`` and a stage is never idle: throughput is
one micro-batch per max-stage time. With fewer sequences than stages (``m < pp``) the chain dominates and the
stages are idle ``1 - m t / chain`` of the time: the pipeline bubble. A single sequence's token takes the chain,
the sum of the stage times plus ``pp - 1`` transfers.

Not modelled (docs/models.md): micro-batches of unequal size or content (the scheduler does not assign requests
to virtual engines; V0's split of the KV pool into ``pp`` parts is not applied, the pool is shared as in V1);
the time a micro-batch waits for its previous round's token before it can be scheduled again beyond the chain;
overlap of host scheduling with the stages (the fixed overhead is charged once per round); point-to-point latency
(bandwidth only); cross-node links (every stage in one server, on the GPU's ``nvlink_bytes_per_s``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from sim.timing.compute import BatchShape, RooflineComputeModel
from sim.timing.decode_run_times import steps_until
from sim.units import US_PER_S


@dataclass(frozen=True)
class PipelineComputeModel(RooflineComputeModel):
    """:class:`RooflineComputeModel` of the whole model (``model``) split over ``pp`` pipeline stages, each of
    ``tp`` tensor-parallel workers (see the module docstring for the formula).

    Raises:
        CatalogError: ``pp`` outside ``[1, num_layers]`` or a ``tp`` that does not divide the heads.
    """

    pp: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.model.pipeline_layers(self.pp)

    @cached_property
    def stage_models(self) -> tuple[RooflineComputeModel, ...]:
        """One roofline per stage on its own layers, without fixed costs (those are charged once per round)."""
        base = {f.name: getattr(self, f.name) for f in fields(RooflineComputeModel)}
        base.update(overhead_us=0.0, launch_floor_us=0.0, launch_us_per_layer=0.0, decode_graphs=0.0,
                    decode_overhead_us=0.0, mixed_tile_rows=0.0, wave_us_per_token=0.0, decode_batch_knots=(),
                    decode_batch_correction_us=())
        return tuple(RooflineComputeModel(**{**base, "model": stage}) for stage in self.model.pipeline_stages(self.pp))

    @cached_property
    def _p2p_us_per_token(self) -> float:
        """Time (us) to send one token's hidden state and residual to the next stage."""
        m = self.model
        return 2 * m.hidden_size * m.activation_bytes / (self.gpu.nvlink_bytes_per_s / US_PER_S)

    def iteration_us(self, batch: BatchShape) -> float:
        """Modelled duration (us) of one round of ``batch`` over the pipeline; 0 for an empty batch."""
        return float(self.iteration_us_array(np.array([batch.new_tokens]), np.array([batch.attention_pairs]),
                                             np.array([batch.kv_read_tokens]), np.array([batch.logit_sequences]),
                                             np.array([batch.max_context_tokens]))[0])

    def round_parts_us(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences) -> dict:
        """The terms of the round formula (arrays): ``micro_batches``, ``stage_us`` (``[pp, n]``), ``p2p_us``,
        ``chain_us``, ``busy_us``; for tests and docs."""
        new = np.asarray(new_tokens, dtype=float)
        logits = np.asarray(logit_sequences, dtype=float)
        kv_read = np.asarray(kv_read_tokens, dtype=float)
        mixed = new > logits
        pairs = np.asarray(attention_pairs, dtype=float) + np.where(mixed, self.mixed_tile_rows * kv_read, 0.0)
        micro = np.clip(logits, 1.0, float(self.pp))
        last = len(self.stage_models) - 1
        stage_us = np.stack([
            stage.iteration_us_array(new / micro, pairs / micro, kv_read / micro,
                                     logits / micro if index == last else np.zeros_like(logits))
            for index, stage in enumerate(self.stage_models)])
        p2p_us = (self.pp - 1) * (new / micro) * self._p2p_us_per_token
        chain_us = stage_us.sum(axis=0) + p2p_us
        busy_us = micro * stage_us.max(axis=0)
        return {"micro_batches": micro, "stage_us": stage_us, "p2p_us": p2p_us, "chain_us": chain_us,
                "busy_us": busy_us}

    def iteration_us_array(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences,
                           max_context_tokens=0.0, attention_blocks=0.0, block_keys=0.0) -> np.ndarray:
        """:meth:`iteration_us` of many rounds at once (arrays of :class:`BatchShape` fields); empty ones give 0.
        The thread-block terms are accepted for the signature's sake and not used: micro-batches split them
        in ways the round's totals do not tell (a block-form profile falls back to its estimate per stage)."""
        parts = self.round_parts_us(new_tokens, attention_pairs, kv_read_tokens, logit_sequences)
        new = np.asarray(new_tokens, dtype=float)
        logits = np.asarray(logit_sequences, dtype=float)
        wave_us = self.wave_us_per_token * np.asarray(max_context_tokens, dtype=float)
        round_us = np.maximum(parts["chain_us"], parts["busy_us"]) + wave_us
        floor_us = self._round_floor_us(parts["micro_batches"], max(s.model.num_layers for s in self.stage_models))
        eager = np.maximum(floor_us, round_us + self.overhead_us)
        if self.decode_graphs:
            graphed = round_us + self.decode_overhead_us + self._decode_correction_us(logits)
            eager = np.where(new > logits, eager, graphed)
        return np.where(new > 0, eager, 0.0)

    def decode_run_us(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                      max_context_tokens: int = 0) -> np.ndarray:
        """Durations (us) of ``steps`` consecutive pure-decode rounds of ``batch_size`` sequences (each round
        reads ``batch_size`` more cached tokens), as :meth:`RooflineComputeModel.decode_run_us`."""
        growth = np.arange(steps, dtype=float) * batch_size
        size = np.full(steps, float(batch_size))
        return self.iteration_us_array(size, attention_pairs + growth, kv_read_tokens + growth, size,
                                       max_context_tokens + np.arange(steps, dtype=float))

    def decode_run_iter(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                        max_context_tokens: int = 0):
        """:meth:`decode_run_us` one step at a time (the array's values; us per round)."""
        yield from self.decode_run_us(batch_size, kv_read_tokens, attention_pairs, steps, max_context_tokens).tolist()

    def decode_run_until(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                         max_context_tokens: int, start_us: float, step_extra_us: float, stop_us: float,
                         long_steps: int | None = None):
        """The rounds of :meth:`decode_run_us`'s run that start before ``stop_us`` (the array's values), as
        :meth:`RooflineComputeModel.decode_run_until` gives a run's steps (us)."""
        return steps_until(self.decode_run_us(batch_size, kv_read_tokens, attention_pairs, steps,
                                              max_context_tokens).tolist(),
                           start_us, step_extra_us, stop_us, long_steps)
