"""Calibration and validation: measurements on the GPU that become profile sections, and the comparison of
hardware runs with the simulator.

    vmm            VMM call and page-group latencies -> ``kvsim-profile/1`` JSON (``kvsim calibrate``)
    compute        compute-model grid measurement and fit (``kvsim calibrate --compute``)
    compute_tiled  the tiled-attention fit of the grid
    fitting        least-squares fitting and fit errors shared by the compute fits
    inloop         the compute fit on replays' own iterations (``kvsim calibrate --from-run``)
    paged          the paged-attention baseline measurement
    run_files      reading and checking hardware run directories (config.json, tables)
    validate       ``kvsim validate``: simulator vs hardware run, error tables and overlay
"""
