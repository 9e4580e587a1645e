"""Record schemas shared by the simulator and the hardware replay (``hwbackend``): the same columns, in the
same order, with the same units (microseconds for times, bytes for sizes, page groups for pool counts).

Per-request (:data:`REQUEST_COLUMNS`): id, arrival, prompt and output tokens, first-token and completion
timestamps, TTFT, TPOT (``(completion - first token) / (output - 1)``), E2E, preemptions, last slot, status
(``finished`` or ``rejected``), prompt tokens served from the prefix cache.

Per-iteration (:data:`ITERATION_COLUMNS`): start, duration = sync stall + block-table CPU time + swap time +
clearing/copying time (zero-on-reuse, copy-on-write of shared prefix pages) + compute; page groups mapped on the critical path (``sync_map``) and by the background mapper since the
previous record (``bg_map``); pool state during the iteration (mapped / used / free / deferred page groups,
tail waste bytes of running requests).
"""
REQUEST_COLUMNS = ("request_id", "arrival_at_us", "prompt_tokens", "output_tokens", "first_token_at_us",
                   "completion_at_us", "ttft_us", "tpot_us", "e2e_us", "preemptions", "slot", "status",
                   "prefix_hit_tokens")

ITERATION_COLUMNS = (
    "iteration", "start_at_us", "duration_us", "compute_us", "sync_stall_us", "sync_map_page_groups",
    "bg_map_page_groups", "unmap_page_groups", "prefill_tokens", "decode_tokens", "batch_size",
    "num_running", "num_waiting", "mapped_page_groups", "used_page_groups", "free_page_groups",
    "deferred_page_groups", "tail_waste_bytes", "preemptions", "block_table_us", "swap_us", "clear_copy_us")
