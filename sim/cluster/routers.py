"""Names of the request routers and of the executors that run replicas or sweep points (importable without
pandas or SimPy, for command-line choices); the routers themselves are in :mod:`sim.cluster.routing`."""
ROUTERS = ("round-robin", "random", "session-hash", "least-outstanding", "prefix-aware", "prefix-approx")
STATE_FREE_ROUTERS = ("round-robin", "random", "session-hash")
EXECUTORS = ("local", "ray")


def routing_spec(text: str) -> str:
    """A routing value: a router name, or a cache-aware router with parameters
    (``prefix-aware:overlap_weight=2,load_weight=1``; :mod:`sim.cluster.routers_prefix`). Raises argparse's
    ArgumentTypeError naming the value."""
    import argparse
    name = text.strip().partition(":")[0]
    if name not in ROUTERS:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(ROUTERS)})")
    if ":" in text:
        from sim.cluster.routers_prefix import parse_routing
        try:
            parse_routing(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("routing=")) from None
    return text.strip()
