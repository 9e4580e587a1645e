"""Several models on one GPU, co-simulated in one SimPy environment on one clock (issue 34).

Every tenant is a :class:`sim.core.engine.Simulator` of its own model, trace, scheduler and policy; what they
share is the GPU:

* **weights**: every tenant's weights stay resident, so the KV memory is
  ``memory_util x HBM - sum(weights)`` (:func:`kv_pool_bytes`);
* **compute** (``compute="serial"``, the default): the tenants' iterations run one at a time on one compute
  resource, first come first served, at iteration granularity. The source of the choice: engines co-located
  with kvcached are separate processes on one GPU (``ovg-project/kvcached`` ``examples/01_simple_two_models``
  starts two ``vllm serve`` processes), and without MPS kernels of different processes do not run
  concurrently: the GPU time-slices between their contexts (NVIDIA MPS documentation, "When to Use MPS":
  without MPS "scheduling resources must be swapped on and off the GPU"). An iteration's kernels are one CUDA
  graph launch or a short burst, so we serialise whole iterations; the context-switch cost itself is not
  modelled. ``compute="isolated"`` gives every tenant its own compute (a MIG-like partition, and the check that
  static sharing equals separate runs);
* **KV memory**, per :class:`Sharing`: ``static`` (fixed shares of the pool: one ordinary replica per tenant)
  or ``elastic`` (one physical pool, :class:`sim.memory.shared_pool.SharedPagePool`: tenants map from it on
  demand within their floors and ceilings; an idle tenant's mapped-but-unused pages are trimmed back after
  ``trim_delay_us``, kvcached's ``trim()``, with the unmaps' VMM time drawn from the latency model).

A tenant may **sleep** after ``sleep_after_us`` without work: its KV pages are released (and, with
``sleep_weights``, its weights too: their bytes join the pool while it sleeps); its next iteration first pays
the wake: the weights copied back from host memory at the GPU's PCIe rate (vLLM sleep mode level 1 "offloads
the model weights [to CPU RAM] and discards the KV cache", docs.vllm.ai features/sleep_mode) plus
:data:`WAKE_FIXED_US`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd
import simpy

from sim.core import runner
from sim.core.collector import quiet_collector
from sim.core.engine import Simulator
from sim.memory.plan import Plan
from sim.memory.shared_pool import SharedPagePool, SharedPoolPolicy, TenantShare
from sim.results.summary import RunResult, build_result
from sim.setup.config import ConfigError, SimConfig
from sim.units import US_PER_S, format_bytes

WAKE_FIXED_US = 100_000.0
"""Fixed part of a wake (us): the vLLM sleep-mode blog (blog.vllm.ai 2025-10-26 "sleep mode") reports wake-ups
of ~0.1-0.4 s for 0.5B-8B models with weights offloaded; the weight copy is modelled separately (bytes / PCIe),
this is the allocator and CUDA-graph re-arming part, taken at the lower end (this project's choice)."""

TRIM_DELAY_US = 1_000_000.0
"""Default idle delay before a tenant's mapped-but-unused pages go back to the pool (1 s: this project's
choice; kvcached trims on demand and keeps 5-10 reserved pages, ``KVCACHED_MIN/MAX_RESERVED_PAGES``)."""


@dataclass(frozen=True)
class TenantConfig(SimConfig):
    """A tenant's :class:`SimConfig` whose KV budget is its share of the co-located pool.

    Attributes:
        kv_share_bytes: bytes of KV memory this tenant may hold (static: its share; elastic: its ceiling);
            None: the ordinary ``memory_util x HBM - own weights``.
    """

    kv_share_bytes: int | None = None

    @cached_property
    def kv_budget_bytes(self) -> int:
        if self.kv_share_bytes is None:
            return super().kv_budget_bytes
        return int(self.kv_share_bytes)


@dataclass(frozen=True)
class Tenant:
    """One model served on the shared GPU.

    Attributes:
        name: label in tables (``t0``, ``t1``, ... or the model name).
        config: its configuration (any policy for static sharing; vAttention without prefix caching for elastic).
        trace: its canonical trace table (on the shared clock).
        floor_frac / ceiling_frac: elastic sharing: share of the pool kept for it / most it may hold.
        sleep_after_us: sleep after this long without work (None: never).
        sleep_weights: also release the weights while asleep.
        slo: its objectives as given (``METRIC=DURATION,...``; judged by :mod:`analysis.colocate`).
    """

    name: str
    config: SimConfig
    trace: pd.DataFrame = field(repr=False)
    floor_frac: float = 0.0
    ceiling_frac: float = 1.0
    sleep_after_us: float | None = None
    sleep_weights: bool = False
    slo: str | None = None


@dataclass(frozen=True)
class Sharing:
    """How the tenants share KV memory and compute.

    Attributes:
        mode: ``static`` or ``elastic``.
        split: static: each tenant's share of the pool (normalised; default equal shares).
        trim_delay_us: elastic: idle time before a tenant's unused mapped pages are trimmed.
        compute: ``serial`` (one compute resource) or ``isolated`` (each tenant computes alone).
    """

    mode: str = "static"
    split: tuple[float, ...] | None = None
    trim_delay_us: float = TRIM_DELAY_US
    compute: str = "serial"


def kv_pool_bytes(tenants: list[Tenant]) -> int:
    """KV bytes of the shared GPU: ``memory_util x HBM - sum of every tenant's weights`` (the first tenant's GPU
    and memory_util; every tenant must name the same GPU, tensor-parallel degree and page size).

    Raises:
        ConfigError: tenants on different GPUs, tp or page sizes; pipeline parallelism; no memory left.
    """
    from sim.units import format_bytes

    names = ("gpu", "tp", "page_size_bytes", "memory_util_frac")

    def shared(c) -> tuple:
        return c.gpu, c.tp, c.page_size_bytes, c.memory_util_frac

    def shown(name: str, value) -> str:
        return format_bytes(value) if name == "page_size_bytes" else str(value)

    first = tenants[0].config
    for tenant in tenants:
        c = tenant.config
        if shared(c) != shared(first):
            differ = "; ".join(f"{n} {shown(n, a)} against {shown(n, b)}"
                               for n, a, b in zip(names, shared(c), shared(first)) if a != b)
            raise ConfigError(f"tenants {tenants[0].name} and {tenant.name} differ ({differ}): every tenant must "
                              "share the GPU, tp, page_size_bytes and memory_util_frac", "tp", "page_size_bytes",
                              "memory_util_frac")
        if c.pp != 1:
            raise ConfigError(f"tenant {tenant.name}: co-location supports pp=1 only")
    weights = sum(t.config.model_spec.weight_bytes(t.config.tp) for t in tenants)
    pool = int(first.memory_util_frac * first.gpu_spec.hbm_bytes) - weights
    if pool <= 0:
        raise ConfigError(f"the tenants' weights ({weights / 2**30:.1f} GiB) leave no KV memory on {first.gpu} at "
                          f"memory_util_frac={first.memory_util_frac}", "memory_util_frac")
    return pool


def tenant_configs(tenants: list[Tenant], sharing: Sharing) -> list[TenantConfig]:
    """Each tenant's configuration with its KV budget: static, ``split_i x pool``; elastic, its ceiling, capped by
    what the other tenants' floors leave (``pool x (1 - sum of their floor_frac)``): a request beyond it can never be
    drawn, so it is rejected at arrival (``pool``), not mid-run.

    Raises:
        ConfigError: a split of the wrong length or with a non-positive share; a share without one page group.
    """
    pool = kv_pool_bytes(tenants)
    if sharing.mode == "static":
        split = sharing.split or tuple(1.0 for _ in tenants)
        if len(split) != len(tenants) or not all(0 < share < float("inf") for share in split):
            raise ConfigError(f"sharing static:split= needs {len(tenants)} positive finite shares, got {list(split)}",
                              "sharing")
        total = sum(split)
        if total == float("inf"):
            raise ConfigError(f"sharing static:split= shares {list(split)} overflow their sum", "sharing")
        budgets = [int(pool * (share / total)) for share in split]     # (a share's fraction first: 1e300 overflowed)
    else:        # its ceiling, and never more than the other tenants' floors leave it (what it can ever draw)
        floors = sum(t.floor_frac for t in tenants)
        budgets = [int(pool * min(t.ceiling_frac, 1.0 - (floors - t.floor_frac))) for t in tenants]
    out = []
    for tenant, budget in zip(tenants, budgets):
        fields = {f: getattr(tenant.config, f) for f in SimConfig.__dataclass_fields__}
        try:
            out.append(TenantConfig(**fields, kv_share_bytes=budget))
        except ConfigError as exc:
            if sharing.mode == "static" and sharing.split and budget < pool // len(tenants):
                # the split's small share, not the memory, leaves the tenant without one unit
                raise ConfigError(f"tenant {tenant.name}: its share of sharing static:split="
                                  f"{'/'.join(f'{x:g}' for x in sharing.split)} is {format_bytes(budget)} of the "
                                  f"{format_bytes(pool)} pool, less than one of its allocation units "
                                  f"({format_bytes(tenant.config.page_group_bytes)}): give it a larger share",
                                  "sharing") from None
            raise ConfigError(f"tenant {tenant.name}: {exc}", *exc.fields) from None
    return out


PAGE_WAIT_US = 1_000.0
"""How long a tenant short of pages waits before trying again (a waking tenant for its weights' pages, an
admission for the pages other tenants' requests hold): 1 ms, a polling step of the model, below one decode
iteration of any catalogue model, so a page freed is taken at most one iteration late."""


class TenantSimulator(Simulator):
    """A tenant's serving loop: the ordinary simulator, with its compute on the shared GPU resource (``gpu``;
    None: its own) and, for elastic sharing, its policy drawing from the shared pool."""

    def __init__(self, config: SimConfig, trace: pd.DataFrame, gpu: simpy.Resource | None = None,
                 pool: SharedPagePool | None = None, index: int = 0, tenant: Tenant | None = None, **kwargs):
        super().__init__(config, trace, **kwargs)
        self.gpu, self.index, self.tenant = gpu, index, tenant
        self.gpu_wait_us = 0.0
        self.asleep = False
        self.sleeps = 0
        self.wake_us_total = 0.0
        self.last_busy_at_us = 0.0
        self.trim_unmap_page_groups = 0
        self.trim_vmm_us = 0.0
        self.pool = pool
        self.peers: list[TenantSimulator] = [self]      # every tenant of the GPU (simulate_colocated sets it)
        if pool is not None:      # elastic: the same policy knobs, its free page groups the pool's
            self.policy = SharedPoolPolicy(self.policy.config, pool, index)
            if self.mapper is not None:
                self.mapper.policy = self.policy
            pool.reclaimers[index] = self.trim      # another tenant short of pages takes back this one's reserve

    # ---- a tenant short of pages waits for the others' (elastic) -------------------------------------------
    def _others_running(self) -> bool:
        """Whether another tenant has running requests or background maps in flight: the pages they hold come
        back as those finish, or become trimmable once mapped (a tenant only waiting does not count: two such
        tenants would wait on each other)."""
        return any(peer is not self and (peer.running or (peer.mapper is not None and not peer.mapper.idle))
                   for peer in self.peers)

    def _may_wait_for_pages(self) -> bool:
        """A request alone that the pool cannot hold waits (preempted) while other tenants' running requests
        hold pages: they free them as they finish (a single engine would reject it: nothing else could ever free
        them). The other tenants' idle reserve was already trimmed (:meth:`SharedPoolPolicy.step`)."""
        return self.pool is not None and self._others_running()

    def _unblock_admission(self):
        """Nothing could be scheduled: as :meth:`Simulator._unblock_admission`, but under elastic sharing the
        other tenants' reserves are trimmed first (admission is tried again when that gave this tenant pages),
        and while their running requests hold pages the queue's head waits (:data:`PAGE_WAIT_US`, then admission
        is tried again) instead of being rejected."""
        if (yield from self._settle_mapper()):
            return
        if self.pool is not None and not self.running:
            before = self.policy.free_page_groups
            self.pool.reclaim_for(self.index)
            if self.policy.free_page_groups > before:
                return
            if self._others_running():
                yield self.env.timeout(PAGE_WAIT_US)
                return
        yield from super()._unblock_admission()

    def _run_compute(self, compute_us: float):
        if self.asleep:
            yield from self._wake()
        if self.gpu is None:
            yield self.env.timeout(compute_us)
        else:
            asked_at_us = self.env.now
            with self.gpu.request() as turn:
                yield turn
                self.gpu_wait_us += self.env.now - asked_at_us
                yield self.env.timeout(compute_us)
        self.last_busy_at_us = self.env.now

    # ---- sleep / wake ----------------------------------------------------------------------------------
    @property
    def weight_pages(self) -> int:
        return self.config.model_spec.weight_bytes(self.config.tp) // self.config.page_size_bytes

    def idle(self) -> bool:
        return not self.running and not self.waiting and (self.mapper is None or self.mapper.idle)

    def trim(self) -> int:
        """Unmap the idle slots' pages (kvcached ``trim()``); their VMM time is drawn and recorded (off the
        serving path: the tenant is idle). Returns the page groups unmapped."""
        unmaps = self.policy.trim_idle() if isinstance(self.policy, SharedPoolPolicy) else []
        if not unmaps:
            return 0
        plan = Plan(unmaps=tuple(unmaps))
        self.trim_vmm_us += self.cost.plan_us(plan)
        self.trim_unmap_page_groups += plan.num_page_groups_unmapped
        return plan.num_page_groups_unmapped

    def sleep(self) -> None:
        """Release the KV pages (and with ``sleep_weights`` the weights' pages into the pool)."""
        self.trim()
        self.asleep = True
        self.sleeps += 1
        if self.tenant.sleep_weights and self.pool is not None:
            self.pool.pool_pages += self.weight_pages
            self.pool.free_pages += self.weight_pages

    def _wake(self):
        start_us = self.env.now
        copy_us = 0.0
        if self.tenant.sleep_weights:
            if self.pool is not None:
                while self.pool.free_pages < self.weight_pages:      # the weights' pages must be free again
                    # its own and the others' mapped-but-unused pages go first (its mapper's eager maps while it
                    # waited took the very pages its weights need: helper-50's 8.6 s wake)
                    if not (self.trim() or self.pool.reclaim_for(self.index)):
                        yield self.env.timeout(PAGE_WAIT_US)
                self.pool.pool_pages -= self.weight_pages
                self.pool.free_pages -= self.weight_pages
            # the weights come back over PCIe whatever the sharing (static: their memory was offloaded as vLLM's
            # sleep level 1 does, though no other tenant could use it; helper-56: static wakes cost 0.1 s)
            copy_us = self.config.model_spec.weight_bytes(self.config.tp) / (self.config.gpu_spec.pcie_bytes_per_s
                                                                              / US_PER_S)
        yield self.env.timeout(WAKE_FIXED_US + copy_us)
        self.asleep = False
        self.wake_us_total += self.env.now - start_us

    @property
    def done(self) -> bool:
        return self.num_done >= len(self.requests)


@dataclass
class ColocatedRun:
    """A co-located run's outcome.

    Attributes:
        tenants: the tenants, in order; ``results``: each one's :class:`RunResult`.
        sharing: the sharing used; ``pool_bytes``: the KV pool (after every tenant's weights).
        memory: mapped KV per tenant over time (``time_s`` and one ``<name>_bytes`` column per tenant).
        stats: per tenant: ``peak_kv_bytes``, ``mean_kv_bytes``, ``moved_in_pages``, ``gpu_wait_s``,
            ``trim_unmap_page_groups``, ``trim_vmm_ms``, ``sleeps``, ``wake_s``.
    """

    tenants: list[Tenant]
    results: list[RunResult]
    sharing: Sharing
    pool_bytes: int
    memory: pd.DataFrame
    stats: list[dict]


def elastic_pool(tenants: list[Tenant], configs: list[TenantConfig]) -> SharedPagePool:
    """The one physical page pool of elastic sharing: ``kv_pool_bytes // page_size_bytes`` pages; each tenant's
    floor (``floor_frac`` of the pool, in its page groups) and ceiling (its config's ``pool_page_groups``).
    The hardware replay (:mod:`hwbackend.replay.colocate`) draws its tenants' pages through the same pool.

    Raises:
        ConfigError: a tenant not on the vattention policy, with prefix caching, or with window-aware
            allocation (a hybrid-attention model's ``window=``).
        ValueError: floors above the pool.
    """
    for tenant, config in zip(tenants, configs):
        if config.policy != "vattention" or config.prefix_caching:
            raise ConfigError(f"tenant {tenant.name}: elastic sharing needs the vattention policy without "
                              "prefix caching (pages mapped through the VMM API)")
        if config.hybrid_alloc:    # its per-group units and window unmaps are not drawn from the shared pool
            raise ConfigError(f"tenant {tenant.name}: elastic sharing takes full-attention page groups; "
                              f"{config.model}'s window-aware allocation (window={config.window_alloc}) is not drawn "
                              "from the shared pool: share the GPU statically for it (sharing mode static)")
    floors = sum(t.floor_frac for t in tenants)
    if floors > 1:       # (helper-61: "a tenant needs 0 <= floor (622) <= ceiling (155)", naming no tenant)
        raise ConfigError("the tenants' floors are shares of one KV pool and sum to "
                          f"{floors:g} (" + ", ".join(f"{t.name} {t.floor_frac:g}" for t in tenants) + "); keep their "
                          "sum at most 1")
    pool_bytes = kv_pool_bytes(tenants)
    shares = []
    for tenant, config in zip(tenants, configs):
        floor_groups = int(pool_bytes * tenant.floor_frac) // config.page_group_bytes
        if floor_groups > config.pool_page_groups:
            raise ConfigError(f"tenant {tenant.name}: floor={tenant.floor_frac:g} of the pool is {floor_groups:,} page "
                              f"groups, more than the {config.pool_page_groups:,} it may hold (its ceiling, or what its "
                              "memory share leaves after its weights); lower its floor")
        shares.append(TenantShare(config.num_sub_tensors, floor_groups, config.pool_page_groups))
    return SharedPagePool(pool_bytes // configs[0].page_size_bytes, shares)


def simulate_colocated(tenants: list[Tenant], sharing: Sharing, profile_path: str | None = None,
                       sample_us: float | None = None) -> ColocatedRun:
    """Co-simulate ``tenants`` on one GPU (module docstring).

    Args:
        tenants: at least one tenant.
        sharing: memory and compute sharing.
        profile_path: calibration profile for every tenant's VMM and compute models.
        sample_us: period of the mapped-memory samples (default: the longest trace's span / 500, >= 10 ms).

    Raises:
        ConfigError: as :func:`tenant_configs`; elastic sharing of a non-vAttention or prefix-caching tenant.
        ValueError: floors above the pool; a request that does not fit its tenant's slot.
    """
    if not tenants:
        raise ConfigError("co-location needs at least one tenant", "tenants")
    configs = tenant_configs(tenants, sharing)
    elastic = sharing.mode == "elastic"
    pool = elastic_pool(tenants, configs) if elastic else None
    env = simpy.Environment()
    gpu = simpy.Resource(env, capacity=1) if sharing.compute == "serial" else None
    sims, metas = [], []
    for index, (tenant, config) in enumerate(zip(tenants, configs)):
        config = runner.profile_config_overrides(config, profile_path)
        vmm, compute = runner.load_models(config, profile_path)
        coalesce = gpu is None and not elastic     # fast-forwarded decode runs would hold the shared resources
        sims.append(TenantSimulator(config, tenant.trace, gpu=gpu, pool=pool, index=index, tenant=tenant,
                                    vmm=vmm, compute=compute, env=env, coalesce=coalesce))
        # each tenant's compute model, as a single run records it (config.json's compute_model): a profile fitted
        # for one tenant's model falls back to the roofline for another's, and says so
        metas.append({**config.to_dict(), "trace_source": tenant.trace.attrs.get("source", "in-memory table"),
                      "vmm_latency_source": vmm.source, "tenant": tenant.name,
                      "compute_model": runner.compute_model_source(config, profile_path)[1]})
    for simulator in sims:
        simulator.peers = sims
        simulator.start()
    span_us = max((float(t.trace["arrival_s"].max()) * US_PER_S for t in tenants if len(t.trace)), default=0.0)
    period_us = sample_us or max(10_000.0, span_us / 500)
    samples: list[tuple] = []
    env.process(_housekeeping(env, sims, sharing, period_us, samples))
    with quiet_collector():
        env.run()
    results = [build_result(s.output(), meta) for s, meta in zip(sims, metas)]
    names = [t.name for t in tenants]
    memory = pd.DataFrame(samples, columns=["time_s", *[f"{n}_bytes" for n in names]])
    stats = [_tenant_stats(s, memory[f"{t.name}_bytes"], pool) for s, t in zip(sims, tenants)]
    return ColocatedRun(tenants, results, sharing, kv_pool_bytes(tenants), memory, stats)


def held_page_groups(policy) -> int:
    """Page groups a tenant's vAttention policy holds: its share of the elastic pool
    (:attr:`SharedPoolPolicy.held_page_groups`), else its mapped groups plus those being mapped. The simulator's
    memory samples and the hardware replay's (:mod:`hwbackend.replay.colocate`) both count this."""
    if isinstance(policy, SharedPoolPolicy):
        return policy.held_page_groups
    return policy.physical_page_groups + sum(policy.in_flight_maps)


def _held_bytes(simulator: TenantSimulator) -> int:
    return held_page_groups(simulator.policy) * simulator.config.page_group_bytes


def _housekeeping(env: simpy.Environment, sims: list[TenantSimulator], sharing: Sharing, period_us: float,
                  samples: list):
    """One process for the shared GPU's background duties, every ``period_us`` until every tenant is done:
    sample each tenant's mapped KV; trim the pages of tenants idle for ``trim_delay_us`` (elastic); put tenants
    idle for their ``sleep_after_us`` to sleep."""
    elastic = sharing.mode == "elastic"
    while True:
        samples.append((env.now / US_PER_S, *[_held_bytes(s) for s in sims]))
        if all(s.done for s in sims):
            return
        for simulator in sims:
            idle_us = env.now - simulator.last_busy_at_us
            if not simulator.idle() or simulator.asleep:
                continue
            sleep_after = simulator.tenant.sleep_after_us
            if sleep_after is not None and idle_us >= sleep_after and simulator.num_done:
                simulator.sleep()
            elif elastic and idle_us >= sharing.trim_delay_us:
                simulator.trim()
        yield env.timeout(period_us)


def _tenant_stats(simulator: TenantSimulator, held_bytes: pd.Series, pool: SharedPagePool | None) -> dict:
    group_bytes = simulator.config.page_group_bytes
    if pool is not None:
        peak = pool.peak_groups[simulator.index] * group_bytes
        moved = pool.moved_in_pages[simulator.index]
    else:
        peak, moved = int(held_bytes.max()) if len(held_bytes) else 0, 0
    return {"peak_kv_bytes": int(peak), "mean_kv_bytes": float(held_bytes.mean()) if len(held_bytes) else 0.0,
            "moved_in_pages": int(moved), "moved_in_bytes": int(moved * simulator.config.page_size_bytes),
            "gpu_wait_s": simulator.gpu_wait_us / US_PER_S,
            "trim_unmap_page_groups": simulator.trim_unmap_page_groups, "trim_vmm_ms": simulator.trim_vmm_us / 1e3,
            "sleeps": simulator.sleeps, "wake_s": simulator.wake_us_total / US_PER_S,
            "kv_budget_bytes": simulator.config.kv_budget_bytes}


__all__ = ["ColocatedRun", "Sharing", "Tenant", "TenantConfig", "TenantSimulator", "elastic_pool", "held_page_groups",
           "kv_pool_bytes", "simulate_colocated", "tenant_configs"]
