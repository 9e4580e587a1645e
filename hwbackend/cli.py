"""``kvsim calibrate`` and ``kvsim validate``: the hardware backend's subcommands, wired into ``cli.py``
through :func:`register`."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` and ``validate`` to the ``kvsim`` subcommands (``func(args) -> int``: exit status).

    ``kvsim calibrate [--page-sizes 2MiB,4MiB,32MiB] [--samples N] [--out profiles/NAME.json] [--force]``
    measures VMM latencies; it exits 2 with one message on a machine without a usable GPU or without
    cuda-python, for a bad value, or when the output exists and ``--force`` is not given (as every kvsim refusal:
    docs/cli.md, "Errors").
    ``kvsim calibrate --compute --model M --out PROFILE [--no-paged]`` measures iteration times over a grid
    of batch shapes, fits the roofline compute model and adds the ``compute`` (and ``paged_attention``)
    sections to PROFILE, keeping its other sections.
    ``kvsim calibrate --from-run RUN_DIR [--from-run ...] --out PROFILE [--force]`` fits the compute model on
    the iterations of hardware replays (CPU; :mod:`hwbackend.calibration.inloop`) and adds ``compute_in_loop``
    (and ``vmm_in_loop``) to PROFILE; 2 with one message if PROFILE already holds them and ``--force`` is not
    given, or for a run directory that cannot be fitted on.
    ``kvsim validate [--hw-run DIR] [--profile P] [--out DIR] [workload and config options]`` compares the
    simulator with a hardware replay (``docs/validation/README.md``).
    """
    from analysis.flags import add_out, add_profile, add_quiet
    from sim.frontend.options import add_config_args
    from traces.workload import add_trace_args
    from hwbackend.calibration.vmm_options import add_arguments

    parser = subparsers.add_parser("calibrate", help="measure CUDA VMM latencies (or --compute) into a profile",
                                   description="Measure CUDA VMM call latencies on this GPU and write a "
                                               "kvsim-profile/1 JSON profile (docs/profile-format.md); with "
                                               "--compute, fit the compute model and add it to the profile.")
    add_arguments(parser)
    for action in parser._actions:      # one spelling of a device for calibrate and validate: 0 or cuda:0
        if "--device" in action.option_strings:
            action.type, action.help = device_ordinal, "CUDA device: an ordinal or cuda:N"
    _set_help(parser, "--force", "replace an existing --out profile as a whole (with --from-run: the profile's "
                                 "compute_in_loop section)")
    parser.add_argument("--compute", action="store_true",
                        help="measure iteration times over a grid of batch shapes and fit the compute model")
    parser.add_argument("--model", default="llama-3-8b", help="model of --compute (catalogue name)")
    parser.add_argument("--no-paged", action="store_true", help="with --compute: skip the paged-attention baseline")
    parser.add_argument("--from-run", action="append", default=None, metavar="RUN_DIR",
                        help="fit the compute model on a hardware replay's own iterations (repeatable; no GPU "
                             "needed) and add compute_in_loop / vmm_in_loop to the profile --out")
    parser.add_argument("--grid-dir", "--grid", dest="grid", action="append", default=None, metavar="GRID_DIR",
                        help="(--grid: old spelling, deprecated; sweep's --grid is a grid axis) "
                             "with --from-run: also fit on a calibration grid (python -m hwbackend.calibration.grid; "
                             "repeatable); each run carries equal weight, and the grids together as much as one run")
    parser.add_argument("--form", default="A", choices=("A", "B", "C", "D", "E", "auto", "select"),
                        help="with --from-run: compute-model form to fit: A (roofline attention + longest-sequence "
                             "term), B (attention by thread blocks), C (B with FlashAttention-2's split-KV decodes), "
                             "D (C with the longest block's own time per key), E (D with that block partly after "
                             "the others), auto (all five; the lowest weighted median training error ships), "
                             "select (each run left out of the fit in turn; the form of least time-weighted error on "
                             "the runs it did not see ships; needs two runs or more, 1 + forms x runs fits) "
                             "(default: A)")
    parser.add_argument("--from-vidur", default=None, metavar="DIR",
                        help="import Vidur's published operator profiles (a microsoft/vidur checkout: "
                             "data/profiling/compute/<gpu>/<org>/<model>/mlp.csv, network/<gpu>_dgx/all_reduce.csv; "
                             "no GPU needed) into one profile per GPU and model, vidur-<gpu>-<model>.json in the "
                             "directory --out (default profiles/)")
    parser.set_defaults(func=_run)
    from analysis.output import OUT_RULE
    val = subparsers.add_parser("validate", help="error of the simulator against a hardware replay",
                                description="Simulate the configuration and trace slice of a hardware replay "
                                            "and print the error table (sim / hw - 1).", epilog=OUT_RULE + ".")
    add_trace_args(val)
    add_config_args(val)
    val.add_argument("--hw-run", default=None, help="hardware run directory (python -m hwbackend.replay.cli); "
                                                    "default: replay now on the GPU")
    add_profile(val)
    add_out(val, "directory for validation.md, errors.csv, overlay.html, new or empty (default: none with --hw-run, "
                 "else runs/validate-<UTC time>)")
    add_quiet(val)
    val.add_argument("--device", type=lambda text: f"cuda:{device_ordinal(text)}", default="cuda:0",
                     help="CUDA device of a fresh replay: an ordinal or cuda:N")
    val.add_argument("--compute-model", choices=("auto", "in-loop", "tiled", "roofline"), default="auto",
                     help="simulator compute model from the profile: auto (the first present of compute_in_loop, "
                          "compute.tiled_roofline, compute.roofline; default), in-loop, tiled, or roofline")
    val.set_defaults(func=_validate)


def device_ordinal(text: str) -> int:
    """A CUDA device as ``calibrate --device`` and ``validate --device`` take it: ``0`` or ``cuda:0`` -> 0.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse names the flag).
    """
    digits = text.strip().lower().removeprefix("cuda:")
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a CUDA device (0, 1, ... or cuda:N): {text!r}")
    return int(digits)


def _set_help(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
    """Replace the help of ``flag`` (an option another module added) with ``text``."""
    for action in parser._actions:
        if flag in action.option_strings:
            action.help = text


def _run(args: argparse.Namespace) -> int:
    if (args.grid or args.form != "A") and not args.from_run:
        import sys

        print("kvsim: error: calibrate: --grid-dir and --form fit with --from-run RUN_DIR (a hardware replay; the grid alone "
              "is measured with python -m hwbackend.calibration.grid)", file=sys.stderr)
        return 2
    if args.from_vidur:
        return _from_vidur(args)
    if args.from_run:
        return _from_runs(args)
    if args.compute:
        return _compute(args)
    from hwbackend.calibration.vmm import command

    return command(args, prog="kvsim")


def _compute(args: argparse.Namespace) -> int:
    import json
    import sys

    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        from hwbackend.calibration.compute import run_compute_calibration
    except Exception as exc:
        print(f"kvsim: error: calibrate --compute needs an NVIDIA GPU with torch: {exc}", file=sys.stderr)
        return 2
    sections = run_compute_calibration(args.model, args.out, f"cuda:{args.device}", paged=not args.no_paged,
                                       created_by=" ".join(["kvsim", *sys.argv[1:]]))
    compute = sections["compute"]
    print(f"wrote {args.out}: roofline {json.dumps(compute['roofline'])}, fit error {json.dumps(compute['fit_error'])}")
    if "paged_attention" in sections:
        print(f"paged attention factor {sections['paged_attention']['factor']}")
    return 0


def _from_vidur(args: argparse.Namespace) -> int:
    """``kvsim calibrate --from-vidur DIR [--out OUT_DIR] [--force]``: 2 with one message for a bad directory or CSV,
    or an existing output without ``--force``."""
    import sys
    from pathlib import Path

    from hwbackend.calibration.vidur import VidurError, default_provenance, import_directory

    if args.compute or args.from_run:
        print("kvsim: error: calibrate: --from-vidur imports saved CSVs; leave out --compute and --from-run", file=sys.stderr)
        return 2
    _note_ignored_gpu_flags(args, "--from-vidur")
    root = Path(args.from_vidur)
    if not root.is_dir():
        print(f"kvsim: error: calibrate: --from-vidur {root}: not a directory (a microsoft/vidur checkout)", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out and not str(args.out).endswith(".json") else Path("profiles")
    try:
        written = import_directory(root, out_dir, default_provenance(root, " ".join(["kvsim", *sys.argv[1:]])),
                                   force=args.force)
    except VidurError as exc:
        print(f"kvsim: error: calibrate: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


MIN_ITERATIONS = 1000  # below this a fit of the in-loop model's ~20 fields is warned about


HARNESS_COMPUTE_FITS = ("roofline", "tiled_roofline")
"""The ``compute`` fits of ``kvsim calibrate --compute`` (the harness's grid): a profile fitted on engine replays
(``compute_in_loop.replay_compute == "engine"``) drops them, since they describe the harness, which ran
1.07-2.36x the roofline where the engine kernels run 1.03-1.56x (docs/validation/engine-replay/README.md): the
Qwen2.5-7B tenant of docs/validation/colocate ran +68% at iteration p50 on the harness's tiled fit."""


GPU_MEASUREMENT_FLAGS = ("--page-sizes", "--samples", "--models", "--no-load", "--device")
"""calibrate's flags of a VMM measurement on the GPU: a fit on saved files (``--from-run``, ``--from-vidur``)
measures nothing, so they change nothing there (said in a note, as validate says of flags it ignores)."""


def _note_ignored_gpu_flags(args: argparse.Namespace, mode: str) -> None:
    import sys
    ignored = [flag for flag in GPU_MEASUREMENT_FLAGS if flag in getattr(args, "given_options", ())]
    if ignored:
        print(f"kvsim: note: calibrate {mode} fits on saved files and measures nothing on a GPU: "
              f"{', '.join(ignored)} ignored", file=sys.stderr)


def _from_runs(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from hwbackend.calibration.inloop import InLoopError, calibrate_from_runs
    from hwbackend.calibration.validate_colocate import colocated_member

    if args.compute:
        print("kvsim: error: calibrate: --from-run fits on saved runs; leave out --compute", file=sys.stderr)
        return 2
    _note_ignored_gpu_flags(args, "--from-run")
    for run in args.from_run:
        member = colocated_member(run)
        if member is not None:
            print(f"kvsim: error: calibrate: --from-run {run}: {member}: calibration from a co-located run is not "
                  "supported: its tenants share the GPU's compute, so a tenant's iteration times hold the other "
                  "tenants' work; fit on a single-tenant run of python -m hwbackend.replay.cli", file=sys.stderr)
            return 2
    out = Path(args.out)
    if not out.is_file():
        what = "is a directory" if out.is_dir() else "does not exist"
        print(f"kvsim: error: calibrate: --from-run adds to an existing profile (its vmm section and page-group growths are "
              f"needed): {out} {what}; pass --out PROFILE, e.g. a copy of the GPU's VMM profile "
              f"(cp profiles/h200.json {out if not out.is_dir() else 'my-h200.json'}, then --force to replace its fit)",
              file=sys.stderr)
        return 2
    try:
        profile = json.loads(out.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(f"kvsim: error: calibrate: cannot read the profile {out}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(profile, dict) or profile.get("format") != "kvsim-profile/1" or not isinstance(
            profile.get("vmm"), dict):
        print(f"kvsim: error: calibrate: {out} is not a kvsim-profile/1 profile with a vmm section (kvsim calibrate writes "
              "one on the GPU; docs/profile-format.md)", file=sys.stderr)
        return 2
    if "compute_in_loop" in profile and not args.force:
        print(f"kvsim: error: calibrate: {out} already holds compute_in_loop; pass --force to replace it", file=sys.stderr)
        return 2
    try:
        sections = calibrate_from_runs(args.from_run, profile, command=" ".join(["kvsim", *sys.argv[1:]]),
                                       grid_dirs=args.grid or [], form=args.form)
    except InLoopError as exc:
        print(f"kvsim: error: calibrate: {exc}", file=sys.stderr)
        return 2
    harness_fits = [key for key in HARNESS_COMPUTE_FITS if key in (profile.get("compute") or {})]
    if sections["compute_in_loop"].get("replay_compute") == "engine" and harness_fits and not args.force:
        # measured on a GPU, not re-made without one: removed only when asked (helper-55)
        print(f"kvsim: error: calibrate: {out} holds compute.{' and compute.'.join(harness_fits)} (measured on the GPU "
              "by kvsim calibrate --compute), which an engine fit removes (the harness's timing must not apply to "
              "models outside compute_in_loop's); pass --force to remove them, or --out a copy of the profile",
              file=sys.stderr)
        return 2
    if "vmm_in_loop" in profile and "vmm_in_loop" not in sections:
        print("kvsim: note: no run mapped synchronously, so the profile's vmm_in_loop is removed "
              "(it belonged to the replaced fit)", file=sys.stderr)
    missing_context = [r["dir"] for r in sections["compute_in_loop"]["runs"] if not r["max_context_logged"]]
    if missing_context:
        print(f"kvsim: warning: {', '.join(missing_context)}: shapes.parquet has no max_context_tokens "
              "(older replays), so wave_us_per_token (the longest sequence's cost) is not fitted", file=sys.stderr)
    no_blocks = [r["dir"] for r in sections["compute_in_loop"]["runs"] if not r.get("block_terms_logged", True)]
    if no_blocks and sections["compute_in_loop"].get("form", "A") != "A":
        print(f"kvsim: warning: {', '.join(no_blocks)}: shapes.parquet has no attention_blocks / block_keys "
              "(replays before 2026-12-01), so the block form estimates them for those runs' iterations (one block "
              "per 128 chunk tokens over cached + new keys, low for long chunks)", file=sys.stderr)
    profile.pop("vmm_in_loop", None)
    if sections["compute_in_loop"].get("replay_compute") == "engine" and harness_fits:
        print(f"kvsim: note: the profile's compute.{' and compute.'.join(harness_fits)} (kvsim calibrate --compute: "
              "the PyTorch harness's grid, ~2x slower than the engine kernels) removed: for a model outside "
              "compute_in_loop's the built-in roofline applies, not the harness's timing", file=sys.stderr)
        for key in harness_fits:
            del profile["compute"][key]
    profile.update(sections)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    fit = sections["compute_in_loop"]
    print(f"wrote {out}: compute_in_loop fitted on {sum(r['iterations'] for r in fit['runs'])} iterations of "
          f"{len(fit['runs'])} run(s); fit error (|model / measured - 1|) {json.dumps(fit['fit_error'].get('all_corrected', fit['fit_error']['all']))}")
    total = sum(r["iterations"] for r in fit["runs"])
    if total < MIN_ITERATIONS:
        print(f"kvsim: warning: {total} iterations are few for {len(fit['params'])} fitted fields; "
              f"a replay of a few minutes gives >= {MIN_ITERATIONS:,}", file=sys.stderr)
    if "vmm_in_loop" in sections:
        v = sections["vmm_in_loop"]
        print(f"  page-group growth in the loop {v['in_loop_growth']['mean_us']:.0f} us vs "
              f"{v['isolated_growth_mean_us']:.0f} us isolated: growth_scale {v['growth_scale']}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    """``kvsim validate``; a bad run directory, ``--profile`` or ``--out`` (ValueError / OSError, the message
    naming the file, field and value) prints one ``kvsim: error: ...`` line and exits 2."""
    import sys

    from hwbackend.calibration.validate import command
    from hwbackend.calibration.validate_colocate import colocated_parent, is_colocated_run

    from analysis.flags import ERROR_PREFIX, Progress

    try:
        if args.hw_run is not None and is_colocated_run(args.hw_run):   # python -m hwbackend.replay.colocate
            from hwbackend.calibration.validate_colocate import command
        elif args.hw_run is not None and (parent := colocated_parent(args.hw_run)) is not None:
            print(f"{ERROR_PREFIX}--hw-run {args.hw_run} is tenant {parent[1]!r} of the co-located run {parent[0]}: "
                  f"validate the whole run (kvsim validate --hw-run {parent[0]}); alone, the tenant would be "
                  "simulated without the other tenants' compute and memory", file=sys.stderr)
            return 2
        with Progress(None, args.quiet, "validating (simulation; replay without --hw-run)"):
            return command(args)
    except BrokenPipeError:
        raise  # cli.main: output piped into e.g. head, not an error
    except (ValueError, OSError) as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr)
        return 2
