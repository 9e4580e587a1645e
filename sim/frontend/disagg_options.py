"""Command-line options of disaggregated prefill/decode runs (``--pd`` and its companions), shared by
``kvsim simulate``, ``capacity`` and ``sweep``, and the :class:`sim.cluster.disagg.DisaggConfig` they describe.

Every value is checked here, so that bad input is one ``kvsim: error:`` line naming the flag and value.
"""
from __future__ import annotations

import argparse
import copy

DISAGG_FLAGS = {"kv_link": "--kv-link", "kv_stream": "--kv-stream", "prefill_policy": "--prefill-policy",
                "decode_policy": "--decode-policy", "prefill_tp": "--prefill-tp", "decode_tp": "--decode-tp"}
"""Destination -> flag of the options that apply only with ``--pd`` (or ``--pd-search``)."""

COLOCATED = ("none", "off", "co-located", "colocated")
"""``--pd`` values that mean co-located serving (a sweep axis ``pd=none,1:1,1:2`` compares both)."""


def add_disagg_args(parser: argparse.ArgumentParser, search: bool = False) -> None:
    """``--pd`` and its companions; with ``search``, also ``--pd-search`` and ``--pd-tp`` (capacity)."""
    from sim.frontend.argtypes import int_at_least
    group = parser.add_argument_group("disaggregated prefill and decode (docs/disaggregated.md)")
    group.add_argument("--pd", default=None, metavar="P:D",
                       help="P prefill and D decode instances, the KV moving between them over --kv-link; none: "
                            "co-located (default: none)")
    group.add_argument("--kv-link", default=None, metavar="LINK",
                       help="KV link per GPU, one direction: nvlink (450 GB/s), ib (InfiniBand NDR, 50 GB/s), pcie "
                            "(Gen5 x16, 55 GB/s) or BANDWIDTH[,LATENCY] e.g. 25GB/s,20us (default: ib)")
    group.add_argument("--kv-stream", default=None, metavar="off|layerwise",
                       help="layerwise: hand the request to a decode instance when its prefill starts and send "
                            "each layer's KV as it is computed (Splitwise); off: after the prefill (default: off)")
    group.add_argument("--prefill-policy", default=None, metavar="SPEC",
                       help="memory policy of the prefill instances (default: --policy)")
    group.add_argument("--decode-policy", default=None, metavar="SPEC",
                       help="memory policy of the decode instances (default: --policy)")
    group.add_argument("--prefill-tp", type=int_at_least(1), default=None,
                       help="tensor-parallel degree of each prefill instance (default: --tp)")
    group.add_argument("--decode-tp", type=int_at_least(1), default=None,
                       help="tensor-parallel degree of each decode instance (default: --tp)")
    if search:
        group.add_argument("--pd-search", type=int_at_least(2), default=None, metavar="GPUS",
                           help="search every P:D (and --pd-tp per role) using at most GPUS GPUs for the most goodput "
                                "per GPU under --slo, against co-located replicas (default: none)")
        group.add_argument("--pd-tp", default=None, metavar="T1,T2",
                           help="with --pd-search: tensor-parallel degrees tried for each role and for the "
                                "co-located replicas (default: --tp)")


def pd_of(args: argparse.Namespace) -> str | None:
    """The ``--pd`` value, ``None`` for co-located serving (no ``--pd``, or one of :data:`COLOCATED`)."""
    value = getattr(args, "pd", None)
    return None if value is None or str(value).strip().lower() in COLOCATED else value


def disagg_companions_given(args: argparse.Namespace) -> list[str]:
    """The companion flags of ``--pd`` / ``--pd-search`` given (:data:`DISAGG_FLAGS`, then ``--pd-tp``), in that
    order: each means nothing without a disaggregated deployment."""
    given = [flag for dest, flag in DISAGG_FLAGS.items() if getattr(args, dest, None) is not None]
    if getattr(args, "pd_tp", None) is not None:
        given.append("--pd-tp")
    return given


def check_disagg_flags(args: argparse.Namespace, allow_unused: bool = False) -> None:
    """Refuse companions of ``--pd`` given without it (unless ``allow_unused``: a sweep whose ``pd`` axis
    holds ``none``), and check every disaggregation value.

    Raises:
        ValueError: one line naming the flag and value.
    """
    args.pd = pd_of(args)
    searching = getattr(args, "pd_search", None) is not None
    if getattr(args, "pd", None) is None and not searching:
        given = disagg_companions_given(args)
        if given and not allow_unused:
            search = " (or --pd-search GPUS)" if hasattr(args, "pd_search") else ""   # capacity has it, simulate not
            raise ValueError(f"{given[0]} applies to disaggregated runs; add --pd P:D{search} or leave {given[0]} out")
        return
    # here: a co-located run (the common case) does not import the disaggregated simulator
    from sim.cluster.disagg import parse_kv_stream, parse_pd
    from sim.timing.kvlink import parse_kv_link
    if (getattr(args, "pp", 1) or 1) > 1:
        raise ValueError(f"--pp {args.pp} applies to co-located replicas; a disaggregated deployment (--pd / "
                         "--pd-search) models tensor parallelism per role only (--prefill-tp, --decode-tp)")
    if (getattr(args, "replicas", 1) or 1) > 1:
        raise ValueError(f"--replicas {args.replicas} applies to co-located serving; a --pd P:D deployment is its "
                         "own P prefill and D decode instances (raise P and D instead)")
    if searching and getattr(args, "pd", None) is not None:
        raise ValueError("--pd and --pd-search exclude each other: --pd evaluates one deployment, --pd-search "
                         "searches them")
    if searching:           # the search tries the degrees of --pd-tp for both roles: per-role ones were dropped
        for dest in ("prefill_tp", "decode_tp"):
            if getattr(args, dest, None) is not None:
                raise ValueError(f"{DISAGG_FLAGS[dest]} applies to one --pd P:D deployment; --pd-search tries the "
                                 "degrees of --pd-tp LIST for each role (e.g. --pd-tp 1,2)")
    if getattr(args, "pd", None) is not None and getattr(args, "pd_tp", None) is not None:
        raise ValueError("--pd-tp applies to --pd-search; for one --pd P:D deployment give --prefill-tp and "
                         "--decode-tp")
    if getattr(args, "pd", None) is not None:
        parse_pd(args.pd)
    if args.kv_link is not None:
        parse_kv_link(args.kv_link)
    if args.kv_stream is not None:
        parse_kv_stream(args.kv_stream)
    if searching:
        from sim.setup.catalog import get_model
        model = get_model(args.model)
        tps = parse_tp_list(getattr(args, "pd_tp", None), args.tp)
        if isinstance(args.pd_search, int) and min(tps) > args.pd_search:
            raise ValueError(f"--pd-search {args.pd_search}: no deployment fits {args.pd_search} GPU(s) with --pd-tp "
                             f"{','.join(map(str, tps))} (a replica or instance needs tp GPUs)")
        for tp in tps:
            if model.num_kv_heads % tp or model.num_q_heads % tp:
                raise ValueError(f"--pd-tp {tp} does not divide {args.model}'s {model.num_kv_heads} KV heads and "
                                 f"{model.num_q_heads} query heads")


def parse_tp_list(text: str | None, default: int) -> list[int]:
    """``"1,2"`` -> ``[1, 2]`` (sorted, unique); ``None`` -> ``[default]``.

    Raises:
        ValueError: naming ``--pd-tp`` and the value.
    """
    if text is None:
        return [default]
    try:
        values = sorted({int(item) for item in text.split(",") if item.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise ValueError(f"--pd-tp {text!r}: expected tensor-parallel degrees >= 1, e.g. 1,2")
    return values


def role_config(args: argparse.Namespace, role: str, tp: int | None = None, **overrides):
    """The :class:`sim.setup.config.SimConfig` of one role: the shared options, the role's own policy and tp."""
    from sim.frontend.options import config_from_args
    role_args = copy.copy(args)
    role_args.policy = getattr(args, f"{role}_policy", None) or getattr(args, "policy", None)
    role_args.tp = tp or getattr(args, f"{role}_tp", None) or args.tp
    try:
        return config_from_args(role_args, **overrides)
    except ValueError as exc:        # name the role's own flag where the shared --tp is meant
        if role in ("prefill", "decode") and getattr(args, f"{role}_tp", None) is not None and "tp" in getattr(exc, "fields", ()):
            from sim.frontend.flags import flag_message
            others = [name for name in exc.fields if name != "tp"]     # named by the command line's flags later
            raise type(exc)(flag_message(exc, {}, renames={"tp": f"--{role}-tp"}), *others) from None
        raise


def disagg_config_from_args(args: argparse.Namespace, pd: str | None = None, prefill_tp: int | None = None,
                            decode_tp: int | None = None, **overrides):
    """The :class:`sim.cluster.disagg.DisaggConfig` the options describe (``pd`` and the tps replace the options').

    Raises:
        ValueError / ConfigError / CatalogError: naming the flag and value.
    """
    from sim.cluster.disagg import DisaggConfig, parse_kv_stream, parse_pd
    from sim.timing.kvlink import parse_kv_link
    num_prefill, num_decode = parse_pd(pd or args.pd)
    link = parse_kv_link(args.kv_link or "ib")
    streaming = parse_kv_stream(args.kv_stream or "off")
    return DisaggConfig(role_config(args, "prefill", prefill_tp, **overrides),
                        role_config(args, "decode", decode_tp, **overrides), num_prefill, num_decode, link, streaming)


__all__ = ["COLOCATED", "DISAGG_FLAGS", "add_disagg_args", "check_disagg_flags", "disagg_config_from_args", "parse_tp_list", "pd_of",
           "role_config"]
