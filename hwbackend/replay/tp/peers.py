"""The compute side of the tensor-parallel replay: rank 0 tells every peer what to compute, and each rank
runs the same command on its own shard. No torch here (the torch runner is
:class:`hwbackend.replay.tp.shard.ModelRunner`; :class:`RecordingRunner` stands in for it in CPU tests).

Per iteration rank 0 *posts* the batch (``forward``: slot, computed, tokens, emits of every sequence) to every
peer and launches its own forward; the peers build the same :class:`hwbackend.replay.model.BatchInputs` and
launch theirs, and the all-reduces inside the forward keep the ranks in step. Nothing is waited for on the
pipe: rank 0 learns that the iteration is over from its own sampled tokens. Set-up commands (identity,
attention backend, warm-up, cache views, graph capture, synchronise) are answered, and run on every rank at
once (:meth:`ComputeGroup.call_all`)::

    rank 0: ReplayLoop ── TPModel.forward(inputs) ─┬─ post("forward", work) ══ pipe ══▶ peer r: runner.forward(work)
                                                   └─ local runner.forward_inputs(inputs)
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from hwbackend.replay.model import SeqWork
from hwbackend.replay.tp.rpc import Channel

RUNNER_COMMANDS = ("hello", "set_attention", "warm", "warm_done", "kv_open", "forward", "capture", "use_graphs",
                   "gc_off", "sync", "log", "launch_times")
"""What a runner may be asked over the compute pipe (``stop`` ends the peer's loop)."""


def encode_work(work: Sequence[SeqWork]) -> list[tuple[int, int, int, bool]]:
    """The iteration's sequences as plain tuples, slot-ascending (the order :class:`BatchInputs` uses)."""
    return [(w.slot, w.computed, w.tokens, w.emits) for w in sorted(work, key=lambda w: w.slot)]


def decode_work(encoded: Sequence[tuple]) -> list[SeqWork]:
    return [SeqWork(int(s), int(c), int(t), bool(e)) for s, c, t, e in encoded]


class ComputeGroup:
    """Rank 0's compute channels to the peers and its own runner.

    Args:
        local: rank 0's runner. channels: one :class:`Channel` per peer, rank order.
    """

    def __init__(self, local: Any, channels: Sequence[Channel]):
        self.local, self.channels = local, list(channels)

    def post(self, command: str, *args: Any) -> None:
        """Send ``command`` to every peer without waiting."""
        for channel in self.channels:
            channel.post(command, *args)

    def call_all(self, command: str, *args: Any) -> list:
        """Run ``command(*args)`` on every rank at once (peers first, then rank 0); returns the results by
        rank. Every peer's reply is collected even when a rank fails; the first failure (rank 0's first) is
        then raised."""
        for channel in self.channels:
            channel.begin(command, *args)
        results, errors = [None] * (1 + len(self.channels)), []
        try:
            results[0] = getattr(self.local, command)(*args)
        except Exception as exc:
            errors.append(exc)
        for rank, channel in enumerate(self.channels, start=1):
            try:
                results[rank] = channel.finish()
            except Exception as exc:
                exc.add_note(f"on tensor-parallel rank {rank}")
                errors.append(exc)
        if errors:
            raise errors[0]
        return results


class TPModel:
    """What :class:`hwbackend.replay.loop.ReplayLoop` sees of the tensor-parallel model: ``device``,
    ``batch_inputs`` and ``forward`` (post the batch to every peer, then run rank 0's shard)."""

    def __init__(self, group: ComputeGroup):
        self.group, self.local = group, group.local
        self.device = group.local.device
        self.batch_inputs = group.local.batch_inputs

    def forward(self, inputs: Any, k_flat: Any, v_flat: Any) -> Any:
        self.group.post("forward", encode_work(inputs.work))
        return self.local.forward_inputs(inputs, k_flat, v_flat)


class RecordedInputs:
    """:class:`hwbackend.replay.model.BatchInputs`' host part, without tensors (:class:`RecordingRunner`)."""

    def __init__(self, work: Sequence[SeqWork], slot_tokens: int, device: Any):
        self.work = sorted(work, key=lambda w: w.slot)
        self.num_tokens = sum(w.tokens for w in self.work)
        self.slot_tokens = slot_tokens


class NoTokens:
    """The sampled tokens of an emulated iteration (``cpu()``, ``numel()``, ``is_cuda`` as a tensor's);
    ``cpu()`` first waits ``wait_s`` (the emulated GPU's time after the launch, during which the mapper works)."""

    is_cuda = False

    def __init__(self, count: int, wait_s: float = 0.0):
        self.count, self.wait_s = count, wait_s

    def cpu(self) -> "NoTokens":
        if self.wait_s:
            time.sleep(self.wait_s)
            self.wait_s = 0.0
        return self

    def numel(self) -> int:
        return self.count


class RecordingRunner:
    """A runner without a model (CPU tests without torch): records every batch it is asked to compute;
    ``compute_us``: rank 0's iterations take that long after their launch (an emulated GPU).

    ``forward`` (peers) and ``forward_inputs`` (rank 0) append the batch's encoded work to :attr:`batches`;
    ``log()`` returns them, so a test can check that every rank computed the same iterations in the same order.
    """

    device = "cpu"
    batch_inputs = RecordedInputs

    def __init__(self, rank: int = 0, compute_us: float = 0.0):
        self.rank, self.cache, self.compute_s = rank, None, compute_us * 1e-6
        self.batches: list[tuple] = []
        self.launches: list[tuple[float, float]] = []
        self.attention = "none"
        self.k: list[Any] = []
        self.v: list[Any] = []

    def attach_cache(self, cache: Any) -> None:
        self.cache = cache

    def hello(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "device": "emulated"}

    def set_attention(self, name: str) -> None:
        self.attention = name

    def warm(self, index: int) -> None:
        """Nothing to warm."""

    def warm_done(self) -> None:
        """Nothing to free."""

    def kv_open(self) -> None:
        layers = self.cache.layout.num_sub_tensors // 2 if self.cache is not None else 0
        self.k, self.v = [None] * layers, [None] * layers

    def forward(self, encoded: Sequence[tuple]) -> None:
        started = time.perf_counter()
        self.batches.append(tuple(map(tuple, encoded)))
        self.launches.append((started, time.perf_counter()))

    def forward_inputs(self, inputs: Any, k_flat: Any, v_flat: Any) -> NoTokens:
        started = time.perf_counter()
        self.batches.append(tuple(encode_work(inputs.work)))
        self.launches.append((started, time.perf_counter()))
        return NoTokens(sum(w.emits for w in inputs.work), self.compute_s)

    def launch_times(self) -> list[tuple[float, float]]:
        return list(self.launches)

    def capture(self, slot: int, max_batch: int) -> dict:
        return {"ok": False, "error": "no model", "seconds": 0.0}

    def use_graphs(self, on: bool) -> None:
        """No graphs."""

    def gc_off(self) -> None:
        """Leave the collector alone (peers may be threads of the test process)."""

    def sync(self) -> None:
        """Nothing in flight."""

    def log(self) -> list[tuple]:
        return list(self.batches)

    def close(self, leave_group: bool = True) -> None:
        """Nothing held."""
