"""Capacity planning: how much traffic one replica serves under latency SLOs, and sweeps of configurations.

    slo           SLO parsing (``ttft_p99=2s,tbt_p99=100ms``), the default scheduling-delay bound, the queueing trend
    capacity      the highest served request rate that meets the SLOs (bracket + bisection), unservable workloads
    sweep         grids of simulate / capacity points, resumable tables (``kvsim sweep``)
    sweep_run     executing sweep points on a local process pool or on Ray
    sweep_figure  the sweep's plotly figure
    cli           ``kvsim capacity`` and ``kvsim sweep``
"""
