"""Serving-engine presets (``SimConfig.engine``): the defaults an engine itself runs with, as :class:`sim.setup.config.SimConfig`
fields, each value read from the engine's own code (file and function cited beside it).

An explicit flag or policy key overrides a preset's value (:func:`sim.frontend.options.config_from_args`); without
an engine nothing here is used and a run is what it was before presets existed.

Sources (read 2026-12 from the public repositories):

* vLLM V1 (``vllm-project/vllm``):
  - ``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``: for the OpenAI API server,
    ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 on GPUs with >= 70 GiB that are not A100s
    ("For GPUs like H100 and MI300x"), else 2048 and 256 (PR #17885: a large budget lowers A100 throughput);
  - ``vllm/engine/arg_utils.py`` ``_set_default_args_v1``: "V1 always uses chunked prefills", "V1 enables prefix
    caching by default"; ``vllm/config/scheduler.py``: ``enable_chunked_prefill = True``, policy ``fcfs``; the V1
    scheduler (``vllm/v1/core/sched/scheduler.py``) schedules the running requests first, then waiting ones
    within the token budget: kvsim's ``sarathi`` discipline;
  - ``vllm/config/cache.py``: ``block_size`` 16 on CUDA; ``enforce_eager = False``: decodes run as CUDA graphs;
  - ``vllm/v1/core/sched/scheduler.py`` (waiting part) asks ``KVCacheManager.allocate_slots`` for the blocks of
    the tokens it schedules now (a request is admitted on its first chunk: kvsim's ``admission="chunk"``), and
    ``allocate_slots`` refuses only when the free blocks are fewer than those needed: no admission watermark (vLLM
    v0's ``BlockSpaceManager`` held 1% back, kvsim's default; an opt-in one came later and is off by default)
    (helper-60: the preset ran whole-prompt admission with the 1% watermark);
  - ``vllm/v1/core/block_pool.py`` ``BlockPool.__init__``: ``self.null_block = self.free_block_queue.popleft()``:
    block 0 never holds KV, so ``num_gpu_blocks - 1`` serve requests (``null_blocks=1``).
* SGLang (``sgl-project/sglang``):
  - ``python/sglang/srt/server_args.py`` (GPU-memory buckets of ``ServerArgs``): ``chunked_prefill_size`` 2048
    below 35 GB, 4096 below 60 GB (A100-40GB, L40), 8192 below 160 GB (A100-80GB, H100, H20, H200), else 16384
    (B200, MI300); ``page_size`` 1 (token-granular pool); radix cache on (``disable_radix_cache = False``); CUDA
    graphs on (``disable_cuda_graph = False``); a prefill batch is run before decodes and not mixed with them
    (``enable_mixed_chunk = False``): kvsim's ``vllm`` (prefill-first) discipline;
  - ``python/sglang/srt/model_executor/model_runner.py``: ``max_running_requests`` defaults to
    ``clamp(max_total_num_tokens / context_len * 512, 2048, 4096)``: at least 2048 (the preset's value).
* vAttention (``microsoft/vattention``, Sarathi-Serve based): ``sarathi-lean/sarathi/engine/arg_utils.py``
  ``EngineArgs``: ``scheduler_type = "sarathi"``, ``max_num_seqs = 256``; ``chunk_size`` is left to the caller
  (``None``): kvsim's 2048 is kept. The vAttention policy, no prefix caching, eager decodes (kvsim's defaults).

Front-end cost (``frontend_overhead_us``, added to TTFT and E2E; docs/serving-semantics.md): the API server,
tokenisation and detokenisation that the engine pays outside the model, in a process apart from the GPU loop
(vLLM V1 ``AsyncLLM``, SGLang's ``TokenizerManager`` / ``DetokenizerManager``), so it delays the request but
takes no iteration time. vLLM: 10 ms, the middle of the 8-15 ms gap between measured and modelled TTFT in the
vLLM v0.15.1 comparison of issue 31 (H100, A100-80GB, L40S). SGLang: no published figure found; vLLM's value,
said so. vAttention: 0, its benchmark driver (``sarathi/benchmark/benchmark_runner.py``) feeds token ids to the
engine in-process, with no HTTP server or text tokenisation.
"""
from __future__ import annotations

from sim.setup.specs import FieldError, GPUSpec

ENGINES = ("vllm-v1", "sglang", "vattention")
"""``engine`` choices."""

GIB = 1024 ** 3
GB_BINARY = 1024 ** 3   # SGLang's buckets compare MiB (``gpu_mem < 60 * 1024``): binary gigabytes

VLLM_FRONTEND_OVERHEAD_US = 10_000.0
SGLANG_FRONTEND_OVERHEAD_US = VLLM_FRONTEND_OVERHEAD_US   # none published: vLLM's, said so in the module notes
VATTENTION_FRONTEND_OVERHEAD_US = 0.0


def _vllm_v1(gpu: GPUSpec) -> dict:
    large = gpu.hbm_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
    return dict(scheduler="sarathi", token_budget=8192 if large else 2048, max_batch_slots=1024 if large else 256,
                policy="paged", block_size_tokens=16, prefix_caching=True, cuda_graph_decodes=True,
                admission="chunk", admission_watermark_frac=0.0, null_blocks=1,
                frontend_overhead_us=VLLM_FRONTEND_OVERHEAD_US)


def _sglang_chunk_tokens(hbm_bytes: int) -> int:
    for limit_gb, tokens in ((35, 2048), (60, 4096), (160, 8192)):
        if hbm_bytes < limit_gb * GB_BINARY:
            return tokens
    return 16384


def _sglang(gpu: GPUSpec) -> dict:
    return dict(scheduler="vllm", token_budget=_sglang_chunk_tokens(gpu.hbm_bytes), max_batch_slots=2048,
                policy="paged", block_size_tokens=1, prefix_caching=True, cuda_graph_decodes=True,
                frontend_overhead_us=SGLANG_FRONTEND_OVERHEAD_US)


def _vattention(gpu: GPUSpec) -> dict:
    return dict(scheduler="sarathi", token_budget=2048, max_batch_slots=256, policy="vattention",
                prefix_caching=False, cuda_graph_decodes=False, frontend_overhead_us=VATTENTION_FRONTEND_OVERHEAD_US)


_PRESETS = {"vllm-v1": _vllm_v1, "sglang": _sglang, "vattention": _vattention}


def engine_preset(engine: str, gpu: GPUSpec) -> dict:
    """The :class:`sim.setup.config.SimConfig` fields ``engine`` sets on ``gpu`` (sources: module docstring).

    Args:
        engine: one of :data:`ENGINES`. gpu: the run's GPU (its HBM size and name pick vLLM's and SGLang's
            budgets).
    Returns:
        ``{field: value}``: scheduler, token_budget, max_batch_slots, policy, block_size_tokens (paged presets),
        prefix_caching, cuda_graph_decodes, frontend_overhead_us (us); vLLM's also admission,
        admission_watermark_frac and null_blocks.
    Raises:
        FieldError: an unknown engine, naming the field ``engine``, the value and the choices.
    """
    preset = _PRESETS.get(engine)
    if preset is None:
        raise FieldError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}", "engine")
    return preset(gpu)


__all__ = ["ENGINES", "engine_preset"]
