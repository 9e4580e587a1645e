"""Record schemas shared by the simulator and the hardware replay (``hwbackend``): the same columns, in the
same order, with the same units (microseconds for times, bytes for sizes, page groups for pool counts).

Per-request (:data:`REQUEST_COLUMNS`): id, arrival, prompt and output tokens, first-token and completion
timestamps, TTFT, TPOT (``(completion - first token) / (output - 1)``), E2E, preemptions, last slot, status
(``finished`` or ``rejected``), prompt tokens served from the prefix cache at its first admission, the start
of the first iteration that scheduled it and the scheduling delay (that start minus arrival), prefix-cache
hits of its re-admissions after preemptions (counted apart), KV tokens dropped by recompute preemptions, and
why a rejected request could not be served (:data:`REJECT_REASONS`; empty otherwise).

Per-iteration (:data:`ITERATION_COLUMNS`): start, duration = sync stall + block-table CPU time + swap time +
clearing/copying time (zero-on-reuse, copy-on-write of shared prefix pages) + compute, plus, for a co-located
tenant with serial compute (``kvsim colocate``), the wait for the GPU while another tenant computes (its total is
the tenant's ``gpu_wait_s``; no column holds it per iteration); page groups mapped on the critical path
(``sync_map``) and by the background mapper since the previous record (``bg_map``), and unmapped since it (the
pages freed by the requests finishing in the last iteration come after the last record: the summary's unmap count
holds them, the column's sum does not); pool state during the iteration (mapped / used / free / deferred page
groups, tail waste bytes of running requests).
"""
from array import array

REQUEST_COLUMNS = ("request_id", "arrival_at_us", "prompt_tokens", "output_tokens", "first_token_at_us",
                   "completion_at_us", "ttft_us", "tpot_us", "e2e_us", "preemptions", "slot", "status",
                   "prefix_hit_tokens", "first_scheduled_at_us", "sched_delay_us", "prefix_hit_tokens_preempted",
                   "recomputed_tokens", "reject_reason")

REJECT_REASONS = {
    "slot": "more KV than one slot holds (a static reservation shorter than the request)",
    "pool": "more KV at its last token than the page pool holds above the admission watermark",
    "pages": "more pages for one step than the pool has, even when running alone",
}
"""Why a request was rejected (the ``reject_reason`` column)."""

ITERATION_COLUMNS = (
    "iteration", "start_at_us", "duration_us", "compute_us", "sync_stall_us", "sync_map_page_groups",
    "bg_map_page_groups", "unmap_page_groups", "prefill_tokens", "decode_tokens", "batch_size",
    "num_running", "num_waiting", "mapped_page_groups", "used_page_groups", "free_page_groups",
    "deferred_page_groups", "tail_waste_bytes", "preemptions", "block_table_us", "swap_us", "clear_copy_us")

ITERATION_UNIQUE_COLUMNS = ("iteration", "start_at_us", "duration_us", "compute_us", "tail_waste_bytes")
"""Iteration columns whose values seldom repeat (on the Azure conversation trace 22-100% of the rows distinct):
a streamed run writes them without a Parquet dictionary. Building one for them is wasted work, since pyarrow
falls back to plain encoding once the dictionary page passes its 1 MiB limit (the table is the same either way;
the conversation trace's row groups are written in 0.09 s instead of 0.21 s and the file is 19.0 MB instead of
20.5 MB). The other columns (counts, page groups, mostly-zero times) are dictionary-encoded."""


def tbt_distinct_us(single_gaps_us, runs):
    """The TBT token multiset as ``(gaps_us, tokens)``: its distinct gaps (us, ascending) and the tokens with
    each gap. Arguments as :func:`tbt_stats_us`; the result depends only on the multiset, not on how it was
    recorded (one gap per token, or a gap standing for a batch's tokens)."""
    import numpy as np

    values = [np.frombuffer(single_gaps_us, dtype=float) if isinstance(single_gaps_us, array)
              else np.asarray(single_gaps_us, dtype=float)]
    weights = [np.ones(len(values[0]), dtype=np.int64)]
    for gaps, weight in runs:
        gaps = np.frombuffer(gaps, dtype=float) if isinstance(gaps, array) else np.asarray(gaps, dtype=float)
        values.append(gaps)
        weights.append(np.full(len(gaps), weight, dtype=np.int64) if np.isscalar(weight)
                       else np.asarray(weight, dtype=np.int64))
    gaps, counts = np.concatenate(values), np.concatenate(weights)
    del values, weights
    # few temporaries at a time: this runs on millions of tokens. Not a stable sort (quicksort: 7x faster on the
    # conversation trace's ~1 M gaps): equal gaps are merged below and their token counts summed in integers, so
    # the order among them changes nothing (gaps are differences end - start, never -0.0)
    order = np.argsort(gaps)
    gaps = gaps[order]
    counts = counts[order]
    del order
    if not len(gaps):
        return gaps, counts
    starts = np.flatnonzero(np.concatenate([[True], gaps[1:] != gaps[:-1]]))
    return gaps[starts], np.add.reduceat(counts, starts)


def tbt_gap_token_sum_us(gaps_us, tokens) -> float:
    """Exactly rounded sum of gap x tokens over distinct gaps (:func:`tbt_distinct_us`): each product is rounded
    once and ``math.fsum`` adds them, so the sum (and the TBT mean) does not depend on the recording order or
    grouping, nor on the BLAS thread count."""
    import math

    return math.fsum((gaps_us * tokens).tolist())


def tbt_stats_us(single_gaps_us, runs) -> dict:
    """Time between tokens (TBT, inter-token latency) over *all* output tokens after each request's first.

    Args:
        single_gaps_us: one gap (us) per token, in any order (a sequence or an ``array('d')``).
        runs: ``(gaps_us, weights)`` pairs: ``gaps_us[i]`` stands for ``weights[i]`` tokens (a step of a
            fast-forwarded decode run emits one token for each of its batch's requests); ``weights`` an int
            per gap, or one int for all.

    Returns:
        ``tbt_p50_us``, ``tbt_p90_us``, ``tbt_p99_us``, ``tbt_max_us``, ``tbt_mean_us`` and ``tbt_tokens``.
        Percentiles are nearest-rank over the token multiset (numpy's ``inverted_cdf``: the smallest gap
        whose cumulative token share reaches q), computed on (gap, tokens) pairs without expanding them; the
        mean is :func:`tbt_gap_token_sum_us` over the tokens. All depend only on the multiset
        (:func:`tbt_distinct_us`). NaN when no request emitted a second token.
    """
    import numpy as np

    gaps, tokens = tbt_distinct_us(single_gaps_us, runs)
    keys = ("tbt_p50_us", "tbt_p90_us", "tbt_p99_us", "tbt_max_us", "tbt_mean_us")
    total = int(tokens.sum())
    if not total:
        return {**dict.fromkeys(keys, float("nan")), "tbt_tokens": 0}
    mean_us = tbt_gap_token_sum_us(gaps, tokens) / total
    cumulative = np.cumsum(tokens)
    out = {f"tbt_p{q}_us": float(gaps[np.searchsorted(cumulative, q / 100 * total, side="left")])
           for q in (50, 90, 99)}
    out.update(tbt_max_us=float(gaps[-1]), tbt_mean_us=mean_us, tbt_tokens=total)
    return out
