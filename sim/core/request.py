"""Per-request state inside the simulator (time in microseconds, see :mod:`sim.units`)."""
from __future__ import annotations


class Request:
    """One request's progress.

    Token bookkeeping (vLLM semantics): the sequence holds ``seq_len = prompt_tokens + generated`` tokens,
    of which ``computed`` have KV in the cache. An iteration processes ``remaining = seq_len - computed``
    tokens in chunks (a prefill, or after a recompute preemption a re-prefill) or exactly one (a decode);
    the chunk that brings ``computed`` to ``seq_len`` emits one new token. The request finishes when
    ``generated == output_tokens``; its KV then holds ``prompt + output - 1`` tokens.
    """

    __slots__ = ("request_id", "arrival_at_us", "prompt_tokens", "output_tokens", "computed", "generated",
                 "slot", "first_token_at_us", "completion_at_us", "preemptions", "admitted_order", "status",
                 "last_slot", "final_kv_tokens", "swapped", "hash_ids", "prefix_hit_tokens", "reject_reason",
                 "preempted_hit_tokens", "recomputed_tokens", "first_scheduled_at_us", "last_token_at_us")

    def __init__(self, request_id: int, arrival_at_us: float, prompt_tokens: int, output_tokens: int):
        self.request_id = request_id
        self.arrival_at_us = arrival_at_us
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.computed = 0
        self.generated = 0
        self.slot = -1
        self.last_slot = -1
        self.first_token_at_us = float("nan")
        self.completion_at_us = float("nan")
        self.preemptions = 0
        self.admitted_order = -1
        self.status = "waiting"
        self.hash_ids: tuple[int, ...] | None = None   # prefix block ids (Mooncake hash_ids), if the trace has them
        self.prefix_hit_tokens = 0
        self.preempted_hit_tokens = 0   # prefix hits of re-admissions after a preemption (counted apart)
        self.recomputed_tokens = 0      # KV tokens dropped by recompute preemptions (computed again later)
        self.first_scheduled_at_us = float("nan")   # start of the first iteration that scheduled it
        self.last_token_at_us = float("nan")        # when its latest output token was emitted (TBT)
        self.reject_reason = ""   # why a rejected request could not be served (see sim.results.records.REJECT_REASONS)
        self.swapped = False  # KV held in host memory after a swap preemption
        self.final_kv_tokens = prompt_tokens + output_tokens - 1  # KV tokens at the last iteration

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining(self) -> int:
        return self.prompt_tokens + self.generated - self.computed

    def record(self, frontend_overhead_us: float = 0.0) -> tuple:
        """Flat per-request record, in the order of :data:`REQUEST_COLUMNS`.

        ``frontend_overhead_us`` (us, ``SimConfig.frontend_overhead_us``): the engine's per-request cost outside
        the model (API server, tokenisation, detokenisation), run in a process apart from the GPU loop; it is
        added to the first-token and completion times the client sees, so to TTFT and E2E, and leaves TPOT and
        every iteration unchanged (docs/serving-semantics.md). 0 leaves the record as it was."""
        first_token_at_us, completion_at_us = self.first_token_at_us, self.completion_at_us
        if frontend_overhead_us:
            first_token_at_us += frontend_overhead_us
            completion_at_us += frontend_overhead_us
        ttft = first_token_at_us - self.arrival_at_us
        e2e = completion_at_us - self.arrival_at_us
        decodes = self.output_tokens - 1
        tpot = (completion_at_us - first_token_at_us) / decodes if decodes > 0 else float("nan")
        return (self.request_id, self.arrival_at_us, self.prompt_tokens, self.output_tokens,
                first_token_at_us, completion_at_us, ttft, tpot, e2e, self.preemptions,
                self.last_slot, self.status, self.prefix_hit_tokens, self.first_scheduled_at_us,
                self.first_scheduled_at_us - self.arrival_at_us, self.preempted_hit_tokens, self.recomputed_tokens,
                self.reject_reason)
