"""Names of the request routers and of the executors that run replicas or sweep points (importable without
pandas or SimPy, for command-line choices); the routers themselves are in :mod:`sim.cluster.routing`."""
ROUTERS = ("round-robin", "random", "session-hash", "least-outstanding")
STATE_FREE_ROUTERS = ("round-robin", "random", "session-hash")
EXECUTORS = ("local", "ray")
