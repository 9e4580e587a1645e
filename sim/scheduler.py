"""Continuous-batching schedulers: which requests run in the next iteration, and how many tokens each.

A scheduler is a function ``(running, waiting, token_budget, admit) -> [(request, tokens), ...]``:

* ``running``: admitted requests, in admission order (list, mutated only through ``admit``).
* ``waiting``: FIFO of requests not holding a slot (deque); admission is strictly FIFO (no skipping).
* ``admit(request, first_tokens) -> int``: asks the memory manager for a slot; returns the tokens actually
  scheduled (0: not admitted; fewer than asked when a prefix-cache hit skips part of the prompt); on
  success the request is appended to ``running``.

Registered in :data:`SCHEDULERS`, chosen by ``--scheduler``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sim.request import Request

Batch = list[tuple[Request, int]]
Admit = Callable[[Request, int], int]


def schedule_sarathi(running: list[Request], waiting: deque, token_budget: int, admit: Admit) -> Batch:
    """Sarathi-Serve chunked prefill (Agrawal et al., OSDI'24): decodes first, then chunks of ongoing
    prefills, then new admissions, until ``token_budget`` tokens are scheduled."""
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
    while waiting and budget > 0:
        request = waiting[0]
        chunk = admit(request, min(request.remaining, budget))
        if not chunk:
            break
        waiting.popleft()
        batch.append((request, chunk))
        budget -= chunk
    return batch


def schedule_vllm(running: list[Request], waiting: deque, token_budget: int, admit: Admit) -> Batch:
    """vLLM (v0) prefill-first: if waiting requests can be admitted, run a prefill-only iteration of whole
    prompts (at most ``token_budget`` tokens, but always at least one prompt); otherwise decode every
    running request."""
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
    if batch:
        return batch
    return [(request, 1) for request in running if request.remaining == 1]


SCHEDULERS: dict[str, Callable[[list[Request], deque, int, Admit], Batch]] = {
    "sarathi": schedule_sarathi,
    "vllm": schedule_vllm,
}
