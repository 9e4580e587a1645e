"""The decode cohort: running requests in plain decode, advanced in aggregate (issue 18).

A request in plain decode (one token per iteration, its first token emitted) changes in a fixed way each
iteration it is scheduled: ``computed`` and ``generated`` grow by one and it emits a token. Until it is due
to finish, or its next step (or, with the asynchronous mapper, its look-ahead) needs a page it has not mapped,
nothing else about it can change, so the serving loop need not visit it. The cohort holds such requests
lazily: a member's ``computed`` is ``offset + clock``, where ``clock`` counts the iterations that scheduled
the cohort, and the loop reads only the cohort's totals (tokens, longest context, used and mapped page
groups, page crossings), each kept up to date in amortised O(log members) per iteration and per join or
leave (O(distinct page residues) for a run of k iterations). A member is written back (``leave``) before the iteration in which it must be handled alone,
so the records are those of visiting every request each iteration (``bench/engine_hashes.py``,
``bench/readme_hashes.py``).

Units: tokens and page groups (``tokens_per_page`` tokens each); times in microseconds (:mod:`sim.units`).
"""
from __future__ import annotations

import heapq

from sim.core.request import Request


class DecodeCohort:
    """Plain-decode requests advanced together (module docstring).

    Args:
        tokens_per_page: tokens per page group (``SimConfig.tokens_per_page``).

    Attributes:
        clock: iterations that scheduled the cohort so far.
        offset_sum: sum over members of ``computed - clock`` (so their KV tokens are ``offset_sum + size x clock``).
        mapped_sum: page groups mapped on the members' slots (constant while they are members).
        used_now: sum over members of ``ceil(computed / tokens_per_page)`` at the current clock.
        joiners: members that have not been scheduled in the cohort yet (their next token's gap runs from
            their own last token, not from the cohort's).
        last_emit_us: when the cohort last emitted its tokens (the end of its latest iteration).
        size: members (kept by :meth:`join` and :meth:`leave`: a plain attribute, read several times a loop pass).
    """

    def __init__(self, tokens_per_page: int):
        self.tokens_per_page = tokens_per_page
        self.clock = 0
        self.offset_sum = 0
        self.mapped_sum = 0
        self.used_now = 0
        self.size = 0
        self.last_emit_us = float("nan")
        self.joiners: dict[Request, None] = {}
        self._members: dict[Request, tuple[int, int, int, int]] = {}   # -> (seq, computed - clock, generated - clock, mapped)
        self._residues: dict[int, int] = {}      # (computed - clock) % tokens_per_page -> members
        self._leave: list[tuple[int, int]] = []  # heap of (clock at which the member must leave, seq)
        self._longest: list[tuple[int, int]] = []  # heap of (-(computed - clock), seq)
        self._by_seq: dict[int, Request] = {}
        self._seq = 0

    def __contains__(self, request: Request) -> bool:
        return request in self._members

    # ---- membership ------------------------------------------------------------------------------------
    def join(self, request: Request, steps: int, mapped_page_groups: int) -> None:
        """Add a plain-decode request that can be scheduled ``steps`` more iterations without finishing or
        needing a page; its slot holds ``mapped_page_groups`` (no background map in flight)."""
        offset = request.computed - self.clock
        seq = self._seq
        self._seq += 1
        self._members[request] = (seq, offset, request.generated - self.clock, mapped_page_groups)
        self.size = len(self._members)
        self._by_seq[seq] = request
        self.offset_sum += offset
        self.mapped_sum += mapped_page_groups
        self.used_now += -(-request.computed // self.tokens_per_page)
        residue = offset % self.tokens_per_page
        self._residues[residue] = self._residues.get(residue, 0) + 1
        heapq.heappush(self._leave, (self.clock + steps, seq))
        heapq.heappush(self._longest, (-offset, seq))
        self.joiners[request] = None

    def leave(self, request: Request) -> None:
        """Remove a member, writing its ``computed``, ``generated`` and ``last_token_at_us`` back.

        Raises:
            KeyError: if ``request`` is not a member.
        """
        seq, offset, generated_offset, mapped = self._members.pop(request)
        self.size = len(self._members)
        del self._by_seq[seq]
        request.computed = offset + self.clock
        request.generated = generated_offset + self.clock
        if request in self.joiners:          # never scheduled in the cohort: its own last token stands
            del self.joiners[request]
        else:
            request.last_token_at_us = self.last_emit_us
        self.offset_sum -= offset
        self.mapped_sum -= mapped
        self.used_now -= -(-request.computed // self.tokens_per_page)
        residue = offset % self.tokens_per_page
        if self._residues[residue] == 1:
            del self._residues[residue]
        else:
            self._residues[residue] -= 1

    def due(self) -> list[Request]:
        """Members that must leave now (their ``steps`` are used up), in joining order."""
        out, heap = [], self._leave
        while heap and heap[0][0] <= self.clock:
            request = self._by_seq.get(heapq.heappop(heap)[1])
            if request is not None:
                out.append(request)
        return out

    def due_at(self, steps: int) -> list[Request]:
        """Members whose stay ends ``steps`` iterations from now, in joining order (the heap's order is kept:
        its entries are distinct ``(clock, seq)`` pairs)."""
        target, heap = self.clock + steps, self._leave
        popped, out = [], []
        while heap and heap[0][0] <= target:
            entry = heapq.heappop(heap)
            popped.append(entry)
            request = self._by_seq.get(entry[1])
            if request is not None and entry[0] == target:
                out.append(request)
        for entry in popped:
            heapq.heappush(heap, entry)
        return out

    def generated_of(self, request: Request) -> int:
        """A member's output tokens so far (its ``generated`` attribute is stale while it is a member)."""
        return self._members[request][2] + self.clock

    def computed_of(self, request: Request) -> int:
        """A member's KV tokens now (its ``computed`` attribute is stale while it is a member)."""
        return self._members[request][1] + self.clock

    # ---- totals ----------------------------------------------------------------------------------------
    def kv_tokens(self) -> int:
        """Sum of the members' ``computed``."""
        return self.offset_sum + self.size * self.clock

    def longest(self) -> int:
        """The largest member ``computed`` (0 without members)."""
        heap = self._longest
        while heap and heap[0][1] not in self._by_seq:
            heapq.heappop(heap)
        return -heap[0][0] + self.clock if heap else 0

    def steps_left(self) -> int:
        """Iterations every member can still be scheduled before one must leave."""
        heap = self._leave
        while heap and heap[0][1] not in self._by_seq:
            heapq.heappop(heap)
        return heap[0][0] - self.clock if heap else 0

    def crossing_now(self) -> int:
        """Members whose used page groups grow in the next iteration (``computed % tokens_per_page == 0``)."""
        return self._residues.get(-self.clock % self.tokens_per_page, 0)

    def crossings(self) -> dict[int, int]:
        """Step residue -> members whose used page groups grow at steps ``j`` of a run starting now with
        ``j % tokens_per_page == residue`` (the layout of ``IterationRecorder.add_run``)."""
        per_page, clock = self.tokens_per_page, self.clock
        return {(-(residue + clock)) % per_page: count for residue, count in self._residues.items()}

    def advance(self, steps: int) -> None:
        """The cohort was scheduled ``steps`` more iterations (its members emitted ``steps`` tokens each)."""
        per_page, clock = self.tokens_per_page, self.clock
        if steps == 1:
            self.used_now += self._residues.get(-clock % per_page, 0)
        else:
            for residue, count in self._residues.items():
                first = -(residue + clock) % per_page        # first step j with (computed + j) % per_page == 0
                if first < steps:
                    self.used_now += count * ((steps - 1 - first) // per_page + 1)
        self.clock = clock + steps
        self.joiners.clear()


__all__ = ["DecodeCohort"]
