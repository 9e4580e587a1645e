"""VMM latency draws taken in blocks from the one seeded generator (issue 32): :class:`BufferedDraws`, the draws
:class:`sim.timing.latency.CallDistribution` makes, the same values in the same order as the generator's own
methods give them."""
from __future__ import annotations

import bisect

import numpy as np


class BufferedDraws:
    """The draws :class:`CallDistribution` makes from a ``numpy.random.Generator`` over PCG64, taken from blocks of
    the generator's raw 64-bit outputs (``bit_generator.random_raw``, at least :data:`BLOCK` at a time) instead of
    one generator call per draw: the same values in the same order, bit for bit (``tests/test_buffered_draws.py``
    checks any interleaving against the generator's own methods).

    Draw order (numpy's ``Generator``, ``numpy/random/src/distributions/distributions.c``): the generator yields
    one stream of 64-bit outputs; ``random(k)`` takes k of them, each ``(x >> 11) * 2**-53``; ``integers(0, n, k)``
    (int64, ``n <= 2**32``) takes 32-bit words - the stored upper half of the last output split for a word
    first (PCG64's ``has_uint32`` / ``uinteger``), else the lower half of a new output, whose upper half is
    stored - and maps each with Lemire's method: ``m = word * n``, redrawn while its low 32 bits fall below
    ``(2**32 - n) % n``, then ``m >> 32``. A block of k draws is mapped with numpy up to the first redraw (for
    the profiles' n of about 1,000, one word in ~4 million), the rest one by one.

    :meth:`sync` gives the generator back the state it would have had after the same draws made directly (it
    replays the outputs used since the start: rare); draws of another kind (``n > 2**32``) sync first.
    """

    BLOCK = 1 << 14
    """Raw 64-bit outputs drawn per block (at least)."""

    def __init__(self, generator: np.random.Generator):
        if not isinstance(generator.bit_generator, np.random.PCG64):
            raise TypeError(f"BufferedDraws needs a PCG64 generator, got {type(generator.bit_generator).__name__}")
        self._generator = generator
        self._start = generator.bit_generator.state      # outputs used since then: _used
        self._has32, self._u32 = self._start["has_uint32"], self._start["uinteger"]
        self._pend = -2           # buffer index of the output whose upper half is stored (-2: from before)
        self._raw = np.zeros(0, dtype=np.uint64)
        self._pos = 0             # next unused output in the buffer
        self._used = 0
        self._words = None        # the buffer's 32-bit words in draw order (low, high, ...), made on first use
        self._mapped: dict[int, tuple[np.ndarray, list[int]]] = {}   # n -> (m >> 32 per word, redraw words)

    def _ensure(self, count: int) -> None:
        """At least ``count`` unused outputs in the buffer (the stored half's output kept with them)."""
        if len(self._raw) - self._pos >= count:
            return
        keep = self._pend if self._has32 and 0 <= self._pend == self._pos - 1 else self._pos
        fresh = self._generator.bit_generator.random_raw(max(self.BLOCK, count))
        self._raw = np.concatenate((self._raw[keep:], fresh))
        self._pos -= keep
        self._pend = self._pend - keep if self._pend >= keep else -2
        self._words, self._mapped = None, {}

    def _take_raw(self, count: int) -> np.ndarray:
        self._ensure(count)
        raw = self._raw[self._pos:self._pos + count]
        self._pos += count
        self._used += count
        return raw

    def _next32(self) -> int:
        if self._has32:
            self._has32 = 0
            return self._u32
        self._ensure(1)
        value = int(self._raw[self._pos])
        self._pend = self._pos
        self._pos += 1
        self._used += 1
        self._has32, self._u32 = 1, value >> 32
        return value & 0xFFFFFFFF

    def random(self, count: int) -> np.ndarray:
        """``generator.random(count)``: floats uniform in [0, 1)."""
        return (self._take_raw(count) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)

    def integer(self, n: int) -> int:
        """``int(generator.integers(0, n))`` for ``1 <= n < 2**32``."""
        if n == 1:
            return 0
        threshold = ((1 << 32) - n) % n
        m = self._next32() * n
        while (m & 0xFFFFFFFF) < threshold:      # leftover < n is implied when below the threshold
            m = self._next32() * n
        return m >> 32

    def integers(self, n: int, count: int) -> np.ndarray:
        """``generator.integers(0, n, count)`` (int64): integers uniform in [0, n), ``n >= 1``."""
        if n == 1:
            return np.zeros(count, dtype=np.int64)
        if n >= 1 << 32:
            generator = self.sync()
            values = generator.integers(0, n, count)
            self.__init__(generator)
            return values
        if self._has32 and self._pend != self._pos - 1:      # the stored half is not next to the buffer's words
            return np.array([self.integer(n) for _ in range(count)], dtype=np.int64)
        self._ensure((count + 1) // 2 + 1)
        word = 2 * self._pos - self._has32
        values, redraws = self._mapped_words(n)
        end = word + count
        if redraws:
            at = bisect.bisect_left(redraws, word)
            if at < len(redraws) and redraws[at] < end:        # a word of these is redrawn: one by one
                return np.array([self.integer(n) for _ in range(count)], dtype=np.int64)
        # take words [word, end): the outputs they come from are used, the last one's upper half stored if unused
        pos = (end + 1) // 2
        self._used += pos - self._pos
        self._pos = pos
        if end % 2:
            self._has32, self._u32, self._pend = 1, int(self._words[end]), pos - 1
        else:
            self._has32, self._u32 = 0, int(self._words[end - 1])
        return values[word:end]

    def _mapped_words(self, n: int) -> tuple[np.ndarray, list[int]]:
        """Lemire's ``m >> 32`` of every word of the buffer for ``n``, and the words that would be redrawn."""
        if n not in self._mapped:
            if self._words is None:
                words = np.empty(2 * len(self._raw), dtype=np.uint64)
                words[0::2] = self._raw & np.uint64(0xFFFFFFFF)
                words[1::2] = self._raw >> np.uint64(32)
                self._words = words
            m = self._words * np.uint64(n)
            redraw = np.flatnonzero((m & np.uint64(0xFFFFFFFF)) < np.uint64(((1 << 32) - n) % n)).tolist()
            self._mapped[n] = ((m >> np.uint64(32)).astype(np.int64), redraw)
        return self._mapped[n]

    def sync(self) -> np.random.Generator:
        """The generator, in the state direct draws would have left it in; returns it."""
        bit_generator = self._generator.bit_generator
        bit_generator.state = self._start
        used = self._used
        while used:
            chunk = min(used, 1 << 20)
            bit_generator.random_raw(chunk)
            used -= chunk
        state = bit_generator.state
        state["has_uint32"], state["uinteger"] = self._has32, self._u32
        bit_generator.state = state
        self.__init__(self._generator)
        return self._generator


__all__ = ["BufferedDraws"]
