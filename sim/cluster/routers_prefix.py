"""Cache-aware routers: each arrival goes to the replica whose prefix cache serves most of its prompt, weighed
against load (routing ``prefix-aware[:overlap_weight=W,load_weight=V]`` and ``prefix-approx[:...]``).

Both score every replica with Dynamo's KV-router cost (NVIDIA Dynamo docs, "Router Design": a worker's cost is
``overlap_weight x potential prefill blocks + potential active blocks``, lowest wins; Dynamo's ``kv-overlap-score-weight``
defaults to 1)::

    cost_r = overlap_weight * (prompt_tokens - overlap_tokens_r) / block + load_weight * active_tokens_r / block

with ``block`` the trace's hash block (512 tokens for Mooncake), ``active_tokens_r`` the prompt plus generated
tokens of the requests outstanding on replica ``r`` (running or waiting), and ties going to the replica with
fewer requests so far, then the lower index. They differ in where ``overlap_tokens_r`` comes from:

* ``prefix-aware`` (exact): the replica's own cache state at the arrival: its HBM hit
  (:meth:`PrefixCachingPolicy.admission_credit`) plus the pages its lower tiers would load, as llm-d's
  ``precise-prefix-cache-scorer`` reads it from the engines' KV events (llm-d docs, "KV-Cache Indexer": the
  indexer subscribes to vLLM's KVEvents, block stored / removed, per pod and tier).
* ``prefix-approx``: the router's own record of the block prefixes it sent to each replica, expiring after
  ``ttl_s`` seconds (default 120), without looking at the replicas: Dynamo's approximate mode
  (Dynamo without KV events: ``ApproxKvIndexer``, ``lib/llm/src/kv_router/approx.rs``, entries expire after a TTL)
  and llm-d's ``approx-prefix-cache-producer`` (an in-memory LRU of prefix hashes sent to each pod). The TTL
  default is kvsim's assumption, not an engine's.

Both need the replicas co-simulated (their state at each arrival): :func:`sim.cluster.routing.co_simulate_least_outstanding`
with the chooser made here.
"""
from __future__ import annotations

from collections.abc import Sequence

from sim.memory.prefix import PrefixCachingPolicy
from sim.memory.tiers import tier_keys

PREFIX_ROUTERS = ("prefix-aware", "prefix-approx")
_KEYS = {"prefix-aware": ("overlap_weight", "load_weight"), "prefix-approx": ("overlap_weight", "load_weight", "ttl_s")}


def parse_routing(spec: str) -> tuple[str, dict]:
    """``"prefix-aware:overlap_weight=2"`` -> ``("prefix-aware", {"overlap_weight": 2.0})``; a plain router name
    -> ``(name, {})``.

    Raises:
        ValueError: naming the routing spec and the valid keys.
    """
    name, _, rest = spec.strip().partition(":")
    params: dict[str, float] = {}
    if rest and name not in _KEYS:
        raise ValueError(f"routing={spec!r}: {name} takes no parameters")
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, _, value = (s.strip() for s in item.partition("="))
        if key not in _KEYS[name]:
            raise ValueError(f"routing={spec!r}: unknown key {key!r}; valid keys: {', '.join(_KEYS[name])}")
        try:
            params[key] = float(value)
        except ValueError:
            raise ValueError(f"routing={spec!r}: {key}={value!r} is not a number") from None
        if not 0 <= params[key] < float("inf"):
            raise ValueError(f"routing={spec!r}: {key} must be a finite number >= 0")
    return name, params


class PrefixChooser:
    """Picks a replica per arrival by the cost in the module docstring.

    Args:
        exact: read each replica's cache (``prefix-aware``) or the router's own record (``prefix-approx``).
        overlap_weight, load_weight: the cost's weights (Dynamo's default overlap weight 1).
        ttl_s: how long the approximate record keeps a block prefix sent to a replica (s).
        block_tokens: tokens per trace hash block.
    """

    def __init__(self, exact: bool, overlap_weight: float = 1.0, load_weight: float = 1.0, ttl_s: float = 120.0,
                 block_tokens: int = 512):
        self.exact, self.overlap_weight, self.load_weight = exact, overlap_weight, load_weight
        self.ttl_us, self.block_tokens = ttl_s * 1e6, block_tokens
        self.sent: list[dict[int, float]] = []        # replica -> block-prefix chain id -> last sent at (us)
        self.overlap_tokens = 0                        # the chosen replicas' overlaps, summed (a diagnostic)

    def __call__(self, simulators: Sequence, assigned: Sequence[int], now_us: float, prompt_tokens: int,
                 hash_ids) -> int:
        if not self.sent:
            self.sent = [{} for _ in simulators]
        ids = tuple(hash_ids) if hash_ids is not None else ()
        chain = PrefixCachingPolicy.block_chain(ids[:prompt_tokens // self.block_tokens]) if ids else []
        costs = []
        for replica, simulator in enumerate(simulators):
            overlap = self._exact_overlap(simulator, ids, prompt_tokens) if self.exact else \
                self._approx_overlap(replica, chain, now_us)
            active = sum(r.prompt_tokens + r.generated for r in (*simulator.running, *simulator.waiting))
            cost = (self.overlap_weight * (prompt_tokens - overlap) + self.load_weight * active) / self.block_tokens
            costs.append((cost, assigned[replica], replica, overlap))
        _, _, choice, overlap = min(costs)
        self.overlap_tokens += overlap
        if chain:
            record = self.sent[choice]
            for chain_id in chain:
                record[chain_id] = now_us
        return choice

    @staticmethod
    def _exact_overlap(simulator, ids: tuple, prompt_tokens: int) -> int:
        """Tokens the replica's cache would serve now: HBM pages plus the pages its tiers hold after them."""
        policy = simulator.policy
        if not ids or not hasattr(policy, "admission_credit"):
            return 0
        hit_tokens, _, _ = policy.admission_credit(ids, prompt_tokens)
        store = getattr(policy, "tier_store", None)
        if store is not None and hit_tokens % policy.config.tokens_per_page == 0:
            found = store.find(tier_keys(policy, ids, prompt_tokens, hit_tokens // policy.config.tokens_per_page))
            hit_tokens += len(found) * policy.config.tokens_per_page
        return hit_tokens

    def _approx_overlap(self, replica: int, chain: list[int], now_us: float) -> int:
        """Tokens of the leading block prefixes the router sent to ``replica`` within the TTL."""
        record, blocks = self.sent[replica], 0
        for chain_id in chain:
            sent_at = record.get(chain_id)
            if sent_at is None or now_us - sent_at > self.ttl_us:
                break
            blocks += 1
        return blocks * self.block_tokens


def make_chooser(name: str, params: dict, block_tokens: int) -> PrefixChooser:
    """The chooser of a parsed routing spec (:func:`parse_routing`) for a cache-aware router."""
    return PrefixChooser(name == "prefix-aware", block_tokens=block_tokens, **params)


__all__ = ["PREFIX_ROUTERS", "PrefixChooser", "make_chooser", "parse_routing"]
