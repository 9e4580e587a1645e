"""Counting a window-aware policy's units (:class:`sim.memory.hybrid.HybridPolicy`, module docstring there): a
request's peak over its steps run alone (the arrival check), and the running requests' used units and tail waste
(the iteration records). Pure: nothing of the pool changes. A group tells its kind by ``holds_state`` (a state
group: one page a request) and ``window_pages`` (a window group: pages ``[base, base + mapped)``)."""
from __future__ import annotations

from collections.abc import Mapping


def peak_units(policy, prompt_tokens: int, final_kv_tokens: int, chunk_tokens: int,
               reserve_tokens: int | None) -> int:
    """Units of ``policy``'s pool (a :class:`sim.memory.hybrid.HybridPolicy`) a request needs at its peak when it
    runs alone: the largest sum over the groups of ``units_g`` x pages held, over its steps (prefill chunks of
    ``chunk_tokens``, then one decode token a step up to ``final_kv_tokens``), and its admission's
    ``HybridPolicy._fresh_units`` (``reserve_tokens``: the whole-prompt rule's reservation, or None). A step holds, in a full group, ``ceil(T / p)`` pages of its
    target ``T``; in a window group those from ``floor(skipped(computed) / p)`` up (the pages a step that
    maps drops first, ``WindowGroupPolicy.step``), and under ``recycle`` the most it held so far (a step
    moves stale handles to the new end only as far as it needs, so the count never falls); in a state group
    one. The sum is nondecreasing over decode steps but for chunked-local groups, whose pages repeat with the
    window: so only the last ``W_max / p + 2`` decode steps that map are evaluated.

    Source: the window rule of vLLM v1 ``SlidingWindowManager.remove_skipped_blocks`` (module docstring)."""
    per_page = policy.config.tokens_per_page
    held = [0] * len(policy.groups)         # a recycle group's pages so far: it never gives one back

    def units_at(before: int, target: int) -> int:
        total, top = 0, -(-target // per_page)
        for index, g in enumerate(policy.groups):
            if g.holds_state:
                total += g.units
            elif g.window_pages:
                need = top - g.group.skipped_tokens(before) // per_page
                if g.mode == "recycle":
                    need = held[index] = max(held[index], need)
                total += g.units * need
            else:
                total += g.units * top
        return total

    steps, computed, chunk = [], 0, max(1, chunk_tokens)
    while computed < prompt_tokens:
        target = min(prompt_tokens, computed + chunk)
        steps.append((computed, target))
        computed = target
    if final_kv_tokens > prompt_tokens:      # decode steps that map a page: computed a multiple of p
        last = (final_kv_tokens - 1) // per_page * per_page
        span = max((g.group.window_tokens for g in policy.groups if g.window_pages), default=0)
        first = max(-(-prompt_tokens // per_page) * per_page, last - (span // per_page + 2) * per_page)
        steps += [(before, before + 1) for before in range(first, last + 1, per_page) if before >= prompt_tokens]
    peak = max((units_at(before, target) for before, target in steps), default=0)
    first_target = min(prompt_tokens, chunk)
    tokens = max(first_target, reserve_tokens or 0)
    admission = sum(g.units * policy._admission_pages(g, first_target, tokens) for g in policy.groups)
    return max(peak, admission)


def used_and_waste(policy, held_tokens: Mapping[int, int]) -> tuple[int, int]:
    """``(used units, tail waste bytes)`` of ``policy``'s running requests (a
    :class:`sim.memory.hybrid.HybridPolicy`); ``held_tokens``: slot -> tokens it holds this iteration (computed +
    scheduled). Per group and slot: the mapped pages ``[base, base + mapped)`` below
    ``ceil(T / p)`` are used (``units_g`` each; a window group's dropped pages below ``base`` are not held, a
    full group's look-ahead pages above ``T`` are not used); the waste is the mapped pages' token room less
    the tokens they hold, at the group's KV bytes per token; a prefix-cache entry several slots map is used
    once. A state group's page is used, no waste. (The engine's count for one group, ``ceil(T / p)`` pages from
    token 0, holds neither units nor windows.)"""
    per_page = policy.config.tokens_per_page
    used = waste = 0
    for g in policy.groups:
        mapped, units = g.mapped, g.units
        if g.holds_state:
            used += units * sum(1 for slot in held_tokens if mapped[slot])
            continue
        base = g.base if g.window_pages else None
        bytes_per_token = g.group.kv_bytes_per_token
        entries = getattr(g, "slot_pages", None)          # prefix caching: pages that are shared entries
        keys = []
        for slot, tokens in held_tokens.items():
            low = base[slot] if base is not None else 0
            top = low + mapped[slot]
            end = min(top, -(-tokens // per_page))
            used += units * max(0, end - low)
            live = max(0, min(tokens, top * per_page) - low * per_page)
            waste += (mapped[slot] * per_page - live) * bytes_per_token
            if entries is not None and entries[slot]:
                keys += [key for page, key in entries[slot].items() if low <= page < end]
        used -= units * (len(keys) - len(set(keys)))       # an entry several slots map is used once
    return used, waste
