"""Continuous-batching schedulers: which requests run in the next iteration, and how many tokens each.

An iteration is scheduled in two parts, in the order the engines use (:func:`schedule_iteration`):

1. **running** requests (``running_part``): decodes and chunks of ongoing prefills. The serving loop then
   gets their memory (``reserve``), preempting the most recently admitted running request while the pool
   cannot cover them. Running requests thus get their memory *before* new prefills are admitted, and a
   request is never preempted in the iteration that admitted it (vLLM v1 ``Scheduler.schedule``: "First,
   schedule the RUNNING requests", then "Next, schedule the WAITING requests" only ``if not
   preempted_reqs``; Sarathi-Serve ``SarathiScheduler._schedule``: running sequences ``can_append_slot`` /
   preempt first, new sequences after).
2. **waiting** requests (``admit_part``), strictly FIFO (no skipping), only when step 1 preempted nothing.
   ``admit(request, first_tokens) -> int`` asks the memory manager for a slot (under the run's admission
   rule, :data:`ADMISSION_RULES`) and returns the tokens actually scheduled (0: not admitted; fewer than
   asked when a prefix-cache hit skips part of the prompt); on success the request joins ``running``.

The vLLM v0 scheduler is prefill-first instead: it tries step 2 first and runs a prefill-only iteration
when anything was admitted, else step 1 (decode every running request).

Registered in :data:`SCHEDULERS`, chosen by ``SimConfig.scheduler``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.core.request import Request

Batch = list[tuple[Request, int]]
Admit = Callable[[Request, int], int]

ADMISSION_RULES = ("whole-prompt", "chunk")   # the same tuple as sim.setup.config.ADMISSION_RULES
"""``whole-prompt``: admit only when the whole prompt's KV fits above the admission watermark, counting the
prompt pages that running requests still need (vLLM v0 ``BlockSpaceManager.can_allocate`` and Sarathi-Serve
``SarathiBlockSpaceManager.can_allocate`` check every block of the prompt against ``watermark_blocks``);
``chunk``: admit when the first scheduled chunk fits (vLLM v1 ``KVCacheManager.allocate_slots`` for
``num_new_tokens``)."""


def sarathi_running(running: list[Request], token_budget: int) -> tuple[Batch, int]:
    """Sarathi-Serve chunked prefill (Agrawal et al., OSDI'24), running part: every decode first, then chunks
    of ongoing prefills, until ``token_budget`` tokens are scheduled. Returns the batch and the budget left."""
    batch: Batch = []
    budget = token_budget
    prefills = []
    for request in running:
        remaining = request.prompt_tokens + request.generated - request.computed   # Request.remaining, inlined
        if remaining == 1:
            if budget > 0:
                batch.append((request, 1))
                budget -= 1
        else:
            prefills.append((request, remaining))
    for request, remaining in prefills:
        if budget <= 0:
            break
        chunk = min(remaining, budget)
        batch.append((request, chunk))
        budget -= chunk
    return batch, budget


def sarathi_admit(waiting: deque, token_budget: int, admit: Admit) -> Batch:
    """Sarathi-Serve, waiting part: admit FIFO, each request's first chunk capped by the budget left."""
    batch: Batch = []
    budget = token_budget
    while waiting and budget > 0:
        request = waiting[0]
        chunk = admit(request, min(request.remaining, budget))
        if not chunk:
            break
        waiting.popleft()
        batch.append((request, chunk))
        budget -= chunk
    return batch


def vllm_running(running: list[Request], token_budget: int) -> tuple[Batch, int]:
    """vLLM v0 (no chunked prefill), running part: one token for every decode; a running request with more
    than one token to compute (a swapped-in or prefix-hit request resuming mid-prompt) computes the rest
    at once. Returns the batch and the budget left (unused: this scheduler admits before decoding)."""
    batch: Batch = []
    budget = token_budget
    for request in running:
        tokens = request.prompt_tokens + request.generated - request.computed   # Request.remaining, inlined
        batch.append((request, tokens))
        budget -= tokens
    return batch, budget


def vllm_admit(waiting: deque, token_budget: int, admit: Admit) -> Batch:
    """vLLM v0 prefill-first, waiting part: whole prompts while they fit ``token_budget`` tokens (always at
    least one prompt)."""
    batch: Batch = []
    budget = token_budget
    while waiting:
        request = waiting[0]
        if batch and request.remaining > budget:
            break
        tokens = admit(request, request.remaining)
        if not tokens:
            break
        waiting.popleft()
        batch.append((request, tokens))
        budget -= tokens
    return batch


@dataclass(frozen=True)
class Scheduler:
    """One scheduling discipline.

    Attributes:
        running_part: ``(running, token_budget) -> (batch, budget_left)``.
        admit_part: ``(waiting, token_budget, admit) -> batch`` of newly admitted requests.
        prefill_first: admit before decoding, and run the admitted prefills alone (vLLM v0).
        default_admission: admission rule when the run does not set one (see :data:`ADMISSION_RULES`).
    """

    running_part: Callable[[list[Request], int], tuple[Batch, int]]
    admit_part: Callable[[deque, int, Admit], Batch]
    prefill_first: bool
    default_admission: str


SCHEDULERS: dict[str, Scheduler] = {
    "sarathi": Scheduler(sarathi_running, sarathi_admit, prefill_first=False, default_admission="whole-prompt"),
    "vllm": Scheduler(vllm_running, vllm_admit, prefill_first=True, default_admission="whole-prompt"),
}


def schedule_iteration(scheduler: Scheduler, running: list[Request], waiting: deque, token_budget: int,
                       admit: Admit, reserve: Callable[[Batch], tuple[Batch, bool]]) -> Batch:
    """Schedule one iteration in the engines' order (module docstring) with a synchronous ``reserve``
    (the hardware replay's; the simulator runs the same steps as SimPy generators in ``sim.core.engine``).

    Args:
        reserve: ``batch -> (batch, preempted)`` gets the running part's memory, preempting (and removing
            from the batch and from ``running``) running requests while the pool cannot cover it;
            ``preempted`` says whether it preempted any.

    Returns:
        The batch (empty when nothing could run: the caller unblocks admission).
    """
    if scheduler.prefill_first:
        admitted = scheduler.admit_part(waiting, token_budget, admit)
        if admitted:
            return admitted
        batch, _ = scheduler.running_part(running, token_budget)
        return reserve(batch)[0] if batch else batch
    batch, budget = scheduler.running_part(running, token_budget)
    preempted = False
    if batch:
        batch, preempted = reserve(batch)
    if not preempted:
        batch += scheduler.admit_part(waiting, budget, admit)
    return batch
