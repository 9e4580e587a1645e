"""The decoder sharded Megatron-style over ``tp`` ranks, and the runner each rank's process drives (torch).

Every rank draws the whole model's weights exactly as the one-GPU replay does
(:class:`hwbackend.replay.model.DecoderModel`, same seed, same order), then keeps its shard and frees the rest,
so TP=1 and TP=``tp`` compute the same function (up to the order of the sums; ``tests/test_tp_replay.py``)::

    W_qkv  rows     [q heads r*Hq/tp.. | k heads r*H/tp.. | v heads r*H/tp..]   column-parallel
    W_o    columns  q heads r*Hq/tp..                                        row-parallel -> all-reduce
    W_gate_up rows  [gate r*F/tp.. | up r*F/tp..]                             column-parallel
    W_down columns  r*F/tp..                                                 row-parallel -> all-reduce
    embedding, norms, LM head: replicated (every rank samples the same tokens)

Two all-reduces per layer (``torch.distributed.all_reduce``, NCCL on GPUs, gloo on CPU) in
:meth:`ShardedDecoderModel.reduce`; the query heads of rank ``r`` share exactly the KV heads it holds
(``Hq / H`` per KV head), so attention needs no communication. Each rank's cache holds its ``H / tp`` KV heads.
"""
from __future__ import annotations

import os
import platform
import socket
import time
from datetime import timedelta
from typing import Any

from hwbackend.replay.model import BatchInputs, DecodeGraphs, DecoderModel, SeqWork, _StaticDecode
from hwbackend.replay.tp.peers import decode_work


class ShardedDecoderModel(DecoderModel):
    """Rank ``rank``'s shard of the decoder of shape ``full_shape`` (``shape`` is ``full_shape.per_worker(tp)``).

    Args:
        full_shape: the whole model's :class:`sim.setup.catalog.ModelSpec`. tp, rank: degree and this rank.
        device, seed, attention: as :class:`DecoderModel`. group: the ``torch.distributed`` group of the
            all-reduces (None: the default group; unused at ``tp`` 1).
    """

    def __init__(self, full_shape: Any, tp: int, rank: int, device: str = "cuda:0", seed: int = 0,
                 attention: str = "varlen", group: Any = None):
        import torch

        if not 0 <= rank < tp:
            raise ValueError(f"rank {rank} of tp {tp}")
        if full_shape.ffn_size % tp:
            raise ValueError(f"tp {tp} does not divide the MLP width {full_shape.ffn_size}")
        full_shape.check_tp(tp)  # the query and KV heads
        full = DecoderModel(full_shape, device=device, seed=seed, attention=attention)
        self.full_shape, self.tp, self.rank, self.group = full_shape, tp, rank, group
        self.shape = full_shape.per_worker(tp)
        self.device, self.attention, self.dtype = full.device, attention, full.dtype
        self.embed, self.final_norm, self.lm_head = full.embed, full.final_norm, full.lm_head
        self.graphs = None
        self.layers = []
        for index, w in enumerate(full.layers):
            self.layers.append(shard_layer(w, full_shape, tp, rank))
            full.layers[index] = None  # the whole layer is freed as soon as its shard is copied
        del full
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reduce(self, partial: Any) -> Any:
        """All-reduce (sum) the row-parallel projection's partial output over the ranks, in place."""
        if self.tp == 1:
            return partial
        import torch.distributed as dist

        dist.all_reduce(partial, group=self.group)
        return partial


def shard_layer(w: dict, full: Any, tp: int, rank: int) -> dict:
    """Rank ``rank``'s copy of one layer's weights ``w`` (a :class:`DecoderModel` layer dict)."""
    import torch

    d = full.head_dim
    q_dim, kv_dim = full.num_q_heads * d, full.num_kv_heads * d
    q, kv, f = q_dim // tp, kv_dim // tp, full.ffn_size // tp
    qkv = w["qkv"]
    return dict(norm1=w["norm1"], norm2=w["norm2"],
                qkv=torch.cat([qkv[rank * q:(rank + 1) * q], qkv[q_dim + rank * kv:q_dim + (rank + 1) * kv],
                               qkv[q_dim + kv_dim + rank * kv:q_dim + kv_dim + (rank + 1) * kv]]).contiguous(),
                o=w["o"][:, rank * q:(rank + 1) * q].contiguous(),
                gate_up=torch.cat([w["gate_up"][rank * f:(rank + 1) * f],
                                   w["gate_up"][full.ffn_size + rank * f:full.ffn_size + (rank + 1) * f]]).contiguous(),
                down=w["down"][:, rank * f:(rank + 1) * f].contiguous())


class TPDecodeGraphs(DecodeGraphs):
    """:class:`DecodeGraphs` for a sharded model: the warm-up forwards of every size run first (they execute
    all-reduces, so every rank runs the same sequence in step), then every size is captured (capturing
    executes nothing, so a rank whose capture fails cannot leave another waiting in a collective). Same
    buffers, same :meth:`replay`.

    Raises:
        RuntimeError: from CUDA or NCCL when a capture fails (the caller agrees with the other ranks to run
            decodes eagerly).
    """

    def __init__(self, model: DecoderModel, k_flat: list[Any], v_flat: list[Any], slot_tokens: int,
                 scratch_slot: int, max_batch: int):
        import torch

        device, self.slot_tokens = model.device, slot_tokens
        start = scratch_slot * slot_tokens
        self.arange = torch.arange(max_batch + 1, device=device, dtype=torch.long)
        self.write_rows = start + self.arange[:max_batch].clone()
        self.cu_q = self.arange.to(torch.int32)
        self.cu_k = torch.full((max_batch + 1,), start, device=device, dtype=torch.int32)
        self.used_k = torch.ones(max_batch, device=device, dtype=torch.int32)
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for n in range(max_batch, 0, -1):
                    model.eager_forward(_StaticDecode(self, n), k_flat, v_flat)
                side.synchronize()
                for n in range(max_batch, 0, -1):
                    graph = torch.cuda.CUDAGraph()
                    # thread-local: calls of other threads (NCCL's watchdog querying events, the VMM threads)
                    # cannot invalidate this thread's capture
                    with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                        self.outputs[n] = model.eager_forward(_StaticDecode(self, n), k_flat, v_flat)
                    self.graphs[n] = graph
        finally:
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
        self.sizes = frozenset(self.graphs)


def init_distributed(spec: Any, rank: int, device: Any) -> bool:
    """Join the process group of ``spec`` (``tp`` > 1 with a backend); returns whether it was joined."""
    if spec.tp == 1 or not spec.dist_backend:
        return False
    import torch.distributed as dist

    options: dict = {}
    if spec.dist_backend == "nccl":
        options["device_id"] = device
    dist.init_process_group(spec.dist_backend, init_method=spec.init_method, rank=rank, world_size=spec.tp,
                            timeout=timedelta(seconds=spec.timeout_s), **options)
    return True


class ModelRunner:
    """Rank ``rank``'s compute: the :class:`ShardedDecoderModel` on ``spec.devices[rank]`` and its K/V views.

    Commands (:data:`hwbackend.replay.tp.peers.RUNNER_COMMANDS`; rank 0 calls them directly, peers over their
    pipe): ``hello`` (identity: device, GPU name and UUID, versions), ``set_attention``, ``warm`` /
    ``warm_done`` (eager warm-up over scratch K/V), ``kv_open`` (views over the opened cache),
    ``forward`` (a posted batch), ``forward_inputs`` (rank 0's own batch), ``capture`` / ``use_graphs``
    (decode CUDA graphs, agreed by every rank), ``sync``.
    """

    batch_inputs = BatchInputs

    def __init__(self, spec: Any, rank: int):
        import torch

        self.spec, self.rank = spec, rank
        self.device = torch.device(spec.devices[rank])
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda:
            torch.cuda.set_device(self.device)
        else:  # CPU ranks share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.tp))
        self.distributed = init_distributed(spec, rank, self.device)
        attention = "varlen" if self.is_cuda else "reference"
        self.model = ShardedDecoderModel(spec.shape, spec.tp, rank, str(self.device), spec.seed, attention)
        self.cache = None
        self.k: list[Any] = []
        self.v: list[Any] = []
        self._scratch = None
        self._captured = None
        self._launches: list[tuple[float, float]] = []

    @property
    def stream_handle(self) -> int:
        import torch

        return torch.cuda.current_stream(self.device).cuda_stream if self.is_cuda else 0

    def attach_cache(self, cache: Any) -> None:
        self.cache = cache

    def hello(self) -> dict:
        import torch

        info = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "device": str(self.device),
                "torch_version": torch.__version__, "python_version": platform.python_version(),
                "dist_backend": self.spec.dist_backend if self.distributed else None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
        if self.is_cuda:
            props = torch.cuda.get_device_properties(self.device)
            info.update(gpu_name=props.name, gpu_uuid=str(getattr(props, "uuid", "")),
                        pci_bus_id=getattr(props, "pci_bus_id", None))
            try:
                info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # a torch without NCCL
                info["nccl_version"] = None
        return info

    def choose_attention(self, requested: str) -> tuple[str, dict]:
        """As the one-GPU replay (:func:`hwbackend.replay.cli.choose_attention`), on this rank's shard."""
        from hwbackend.replay.cli import choose_attention

        return choose_attention(self.model, requested)

    def set_attention(self, name: str) -> None:
        self.model.attention = name

    # ---- warm-up -------------------------------------------------------------------------------------
    def warm(self, index: int, wait: bool = False) -> None:
        """Run warm-up batch ``index`` of :data:`hwbackend.replay.cli.WARMUP_SHAPES` eagerly over scratch
        K/V (``wait``: until the GPU is done, as the one-GPU warm-up)."""
        import torch

        from hwbackend.replay.cli import WARMUP_SHAPES

        s, slot_tokens = self.model.shape, 2048
        if self._scratch is None:
            slots = max(d + len(c) for d, _, c in WARMUP_SHAPES)
            self._scratch = torch.zeros(slots * slot_tokens, s.num_kv_heads, s.head_dim, device=self.device,
                                        dtype=self.model.dtype)
        decodes, context, chunks = WARMUP_SHAPES[index]
        work = ([SeqWork(i, context, 1, True) for i in range(decodes)]
                + [SeqWork(decodes + j, c, t, True) for j, (t, c) in enumerate(chunks)])
        tokens = self.model.eager_forward(BatchInputs(work, slot_tokens, self.device),
                                          [self._scratch] * s.num_layers, [self._scratch] * s.num_layers)
        if wait:
            tokens.cpu()

    def warm_done(self) -> None:
        import torch

        self._scratch = None
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # ---- the cache -----------------------------------------------------------------------------------
    def kv_open(self) -> None:
        """K/V views over this rank's opened cache (CUDA: the reserved virtual memory; CPU: host tensors)."""
        import torch

        layout = self.cache.layout
        if self.is_cuda:
            from hwbackend.vmm.tensors import kv_tensors

            tensors = kv_tensors(self.cache, torch.bfloat16, str(self.device))
        else:
            from hwbackend.vmm.host import reserved_host_tensor

            size = (layout.num_slots, layout.max_tokens_per_slot, layout.num_kv_heads, layout.head_dim)
            tensors = [reserved_host_tensor(size) for _ in range(layout.num_sub_tensors)]
        flat = [t.view(-1, layout.num_kv_heads, layout.head_dim) for t in tensors]
        n = self.model.shape.num_layers
        self.k, self.v = flat[:n], flat[n:]

    # ---- iterations ----------------------------------------------------------------------------------
    def forward(self, encoded: list) -> None:
        """A peer's share of one iteration (posted by rank 0: nothing is returned or waited for)."""
        started = time.perf_counter()
        inputs = BatchInputs(decode_work(encoded), self.cache.layout.max_tokens_per_slot, self.device)
        self.model.forward(inputs, self.k, self.v)
        self._launches.append((started, time.perf_counter()))

    def forward_inputs(self, inputs: BatchInputs, k_flat: list[Any], v_flat: list[Any]) -> Any:
        """Rank 0's share: the next tokens (on the device)."""
        started = time.perf_counter()
        tokens = self.model.forward(inputs, k_flat, v_flat)
        self._launches.append((started, time.perf_counter()))
        return tokens

    def launch_times(self) -> list[tuple[float, float]]:
        """Per replayed iteration, host clock (``time.perf_counter``, the system's monotonic clock, shared by
        the ranks' processes) when this rank started building its inputs and when it had launched the forward."""
        return list(self._launches)

    def capture(self, slot: int, max_batch: int) -> dict:
        """Capture :class:`TPDecodeGraphs` over ``slot`` (mapped by rank 0's executor on every rank); returns
        ``{"ok", "error", "seconds"}`` (graphs are used only once every rank succeeded: :meth:`use_graphs`)."""
        started = time.perf_counter()
        try:
            self._captured = TPDecodeGraphs(self.model, self.k, self.v, self.cache.layout.max_tokens_per_slot,
                                            slot, max_batch)
            error = None
        except RuntimeError as exc:
            self._captured, error = None, str(exc).splitlines()[0][:300]
        return {"ok": self._captured is not None, "error": error,
                "seconds": round(time.perf_counter() - started, 1)}

    def use_graphs(self, on: bool) -> None:
        self.model.graphs = self._captured if on else None
        if not on:
            self._captured = None

    def gc_off(self) -> None:
        """Freeze and disable Python's garbage collector for the replay (a full collection costs ~50 ms,
        ``docs/hwbackend.md``; on a peer it would stall every rank at the next all-reduce); on again at close."""
        import gc

        gc.collect()
        gc.freeze()
        gc.disable()
        self._gc_off = True

    def sync(self) -> None:
        import torch

        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def log(self) -> list:
        return []

    def close(self, leave_group: bool = True) -> None:
        """Drop the views and graphs; leave the process group (``leave_group``: with NCCL every rank must,
        so a peer whose rank 0 is gone does not)."""
        self.model.graphs = self._captured = None
        self.k, self.v = [], []
        if getattr(self, "_gc_off", False):
            import gc

            gc.enable()
            self._gc_off = False
        if self.distributed and leave_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.distributed = False
