"""VMM latencies drawn in blocks (issue 32): :class:`sim.timing.latency.BufferedDraws` gives the values a
numpy ``Generator`` (PCG64) gives, in the same order, for any interleaving of the draws the latency model makes
(``random(k)``, ``integers(0, n, k)`` for any n), and hands the generator back in the state direct draws leave."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.timing.draws import BufferedDraws
from sim.timing.latency import CallDistribution

DRAW = st.tuples(st.sampled_from(["random", "integers", "integer"]),
                 # 3 x 2**30: a quarter of the words are redrawn (Lemire's rejection), exercising the one-by-one path
                 st.sampled_from([1, 2, 3, 5, 977, 1000, 123_456_789, 2**31 + 11, 3 * 2**30, 2**32 - 1, 2**32,
                                  2**40 + 3]),
                 st.integers(1, 70))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), draws=st.lists(DRAW, max_size=60), block=st.sampled_from([1, 7, 64, 1 << 14]))
def test_buffered_draws_equal_the_generators(seed, draws, block):
    direct = np.random.default_rng(seed)
    buffered = BufferedDraws(np.random.default_rng(seed))
    buffered.BLOCK = block          # blocks that end inside a draw, too
    for kind, n, count in draws:
        if kind == "random":
            assert buffered.random(count).tolist() == direct.random(count).tolist()
        elif kind == "integer" and n < 2**32:
            assert buffered.integer(n) == int(direct.integers(0, n))
        else:
            assert buffered.integers(n, count).tolist() == direct.integers(0, n, count).tolist()
    assert buffered.sync().bit_generator.state == direct.bit_generator.state


def test_distribution_totals_from_buffered_draws_are_the_direct_ones():
    """A resampled distribution and a quantile one: the same totals (us) bit for bit, one draw or several."""
    resampled = CallDistribution(samples_us=np.array([5.0, 6.5, 7.25, 40.0, 5.5]))
    quantiles = CallDistribution.from_quantiles(5.0, 9.1, 15.7, 6.0)
    direct, buffered = np.random.default_rng(7), BufferedDraws(np.random.default_rng(7))
    for count in [1, 1, 3, 1, 16, 2, 1, 130]:
        for distribution in (resampled, quantiles):
            draws = distribution.sample_us(count, direct)
            expected = float(draws[0]) if count == 1 else float(draws.sum())
            assert distribution.total_us(count, buffered) == expected
