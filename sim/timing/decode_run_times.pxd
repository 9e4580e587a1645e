# Static types for the compiled form of decode_run_times.py (an augmenting .pxd: Cython reads it beside the .py;
# the source runs unchanged as Python). Only the plain-float loop of a memory-bound decode run is typed: its
# arguments and locals are C doubles and integers, so its ~19 steps a run cost no Python float objects but the
# ones it returns (issue 32; docs/scale.md, Round 8). sim/compiled.py hashes this file with its .py.
import cython

@cython.locals(graphs=cython.bint, graph_us=cython.double, check_long=cython.bint, attn_us=cython.double,
               duration_us=cython.double, eager_us=cython.double, end_us=cython.double, _=cython.Py_ssize_t,
               starts_us=list, compute_us=list, gaps_us=list)
cpdef tuple _memory_bound_run(double head_us, double comm_us, object graph_overhead_us, double correction_us,
                              double overhead_us, double floor_us, double kv_bytes_per_token, double bytes_factor,
                              double bytes_per_us, double attention_factor, double layout_factor, double kv_tokens,
                              double growth, Py_ssize_t steps, double start_us, double step_extra_us,
                              double stop_us, object long_steps)
