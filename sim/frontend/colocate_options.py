"""Options of ``kvsim colocate`` (and ``capacity --colocate``): ``--tenant`` and ``--sharing`` specs.

``--tenant model=M,trace=T[,KEY=VALUE...]`` (one per model on the GPU), keys:

=================  ==========================================================================================
``model``          catalogue name or model file (required)
``trace``          trace file or public trace name (default: the built-in synthetic workload)
``name``           label in tables and directory ``tenants/<name>/`` (default ``t<i>-<model>``, a model file's
                   name without folder and suffix; no ``/``, ``\\`` or leading ``.``)
``rate-scale``     arrival-rate multiplier (default 1)
``num-requests``   first N requests; ``skip-requests``: skip the first N
``policy``         memory policy spec with ``:`` between keys, e.g. ``vattention:page=2MiB`` (as ``--policy``)
``scheduler``      ``sarathi`` / ``vllm``; ``token-budget``, ``max-batch``, ``max-context``, ``engine`` as the flags
``slo``            objectives joined by ``+``, e.g. ``ttft_p99=2s+tpot_p99=100ms`` (as ``--slo``)
``floor``          elastic: share of the pool kept for this tenant (0..1, default 0)
``ceiling``        elastic: most of the pool this tenant may hold (0..1, default 1)
``sleep-after``    sleep after this long without work, e.g. ``30s`` (default: never)
``sleep-weights``  ``yes``: also release the weights while asleep (default ``no``)
=================  ==========================================================================================

``--sharing static[:split=a/b/...]`` (fixed shares, default equal) or ``elastic[:trim-delay=1s]``.
"""
from __future__ import annotations

from sim.setup.config import ConfigError

TENANT_KEYS = ("model", "trace", "name", "rate-scale", "num-requests", "skip-requests", "policy", "scheduler",
               "token-budget", "max-batch", "max-context", "allow-long-context", "engine", "slo", "floor", "ceiling",
               "sleep-after", "sleep-weights")
FLAG_KEYS = {"model": "--model", "trace": "--trace", "rate-scale": "--rate-scale", "num-requests": "--num-requests",
              "skip-requests": "--skip-requests", "policy": "--policy", "scheduler": "--scheduler",
              "token-budget": "--token-budget", "max-batch": "--max-batch", "max-context": "--max-context",
              "engine": "--engine"}


def parse_tenant_spec(text: str, index: int) -> dict:
    """``KEY=VALUE,...`` -> dict (keys of :data:`TENANT_KEYS`).

    Raises:
        ConfigError: an item without ``=``, an unknown or repeated key, no ``model``; names the tenant.
    """
    from sim.units import comma_items

    values: dict[str, str] = {}
    try:
        items = comma_items(text, f"--tenant {text!r}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--tenant {text!r}: {item!r} is not KEY=VALUE")
        if key not in TENANT_KEYS:
            raise ConfigError(f"--tenant {text!r}: unknown key {key!r}; choose from {', '.join(TENANT_KEYS)}")
        if key in values:
            raise ConfigError(f"--tenant {text!r}: key {key!r} given twice")
        values[key] = value.strip()
        if not values[key]:
            raise ConfigError(f"--tenant {text!r}: {key}= is empty")
    if "model" not in values:
        raise ConfigError(f"--tenant {text!r}: model= is required")
    values.setdefault("name", f"t{index}-{model_label(values['model'])}")
    name = values["name"]
    if any(c in name for c in "/\\") or name.startswith("."):
        raise ConfigError(f"--tenant {text!r}: name={name!r}: names the directory tenants/<name>/ of the run, so it "
                          "may not contain '/' or '\\' nor start with '.'")
    return values


def model_label(model: str) -> str:
    """A model's label in a default tenant name: a catalogue name as given, a model file's name without its
    folder and suffix (``models/gpt-oss-20b.json`` -> ``gpt-oss-20b``)."""
    from pathlib import PurePath
    path = PurePath(model.replace("\\", "/"))
    return path.stem if path.suffix in (".json", ".toml") or len(path.parts) > 1 else model


def _duration_us(text: str, what: str) -> float:
    from sim.units import parse_duration_us
    try:
        return parse_duration_us(text)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _fraction(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what}={text!r}: not a number") from None
    if not 0 <= value <= 1:
        raise ConfigError(f"{what}={text}: must lie in [0, 1]")
    return value


def policy_spec(text: str) -> str:
    """``vattention:page=2MiB:deferred=off`` -> ``vattention:page=2MiB,deferred=off`` (commas separate tenant keys)."""
    name, sep, rest = text.partition(":")
    return name + (sep + rest.replace(":", ",") if rest else "")


def parse_sharing(text: str, num_tenants: int):
    """``static[:split=a/b/...]`` | ``elastic[:trim-delay=DURATION]`` -> :class:`sim.cluster.colocate.Sharing`
    (compute sharing set by the caller).

    Raises:
        ConfigError: an unknown mode or key, a bad number, a split of the wrong length.
    """
    from sim.cluster.colocate import TRIM_DELAY_US, Sharing
    mode, _, rest = text.partition(":")
    if mode not in ("static", "elastic"):
        raise ConfigError(f"--sharing {text!r}: choose static[:split=a/b/...] or elastic[:trim-delay=1s] "
                          "(kvsim colocate also takes both)")
    split, trim_us = None, TRIM_DELAY_US
    for item in filter(None, rest.split(":")):
        key, _, value = item.partition("=")
        if mode == "static" and key == "split":
            try:
                split = tuple(float(x) for x in value.split("/"))
            except ValueError:
                raise ConfigError(f"--sharing {text!r}: split={value!r} is not numbers joined by '/'") from None
            if (len(split) != num_tenants or not all(0 < share < float("inf") for share in split)
                    or sum(split) == float("inf")):
                raise ConfigError(f"--sharing {text!r}: split needs {num_tenants} positive finite shares "
                                  f"(got {value})")
        elif mode == "elastic" and key == "trim-delay":
            trim_us = _duration_us(value, "--sharing trim-delay")
        else:
            raise ConfigError(f"--sharing {text!r}: unknown key {key!r} for {mode}")
    return Sharing(mode, split, trim_us)


def tenant_extras(values: dict) -> dict:
    """The co-location keys of one tenant: floor, ceiling (fractions), sleep_after_us, sleep_weights, slo.

    Raises:
        ConfigError: a fraction outside [0, 1], floor > ceiling, a bad duration or yes/no, an ``slo`` with an empty
            objective between its ``+`` (a stray leading, trailing or doubled ``+``: read as a comma, it was dropped).
    """
    name = values["name"]
    floor = _fraction(values.get("floor", "0"), f"--tenant {name}: floor")
    ceiling = _fraction(values.get("ceiling", "1"), f"--tenant {name}: ceiling")
    if floor > ceiling or ceiling == 0:
        raise ConfigError(f"--tenant {name}: needs 0 <= floor ({floor}) <= ceiling ({ceiling}) and ceiling > 0")
    sleep_after = (_duration_us(values["sleep-after"], f"--tenant {name}: sleep-after")
                   if "sleep-after" in values else None)
    weights = values.get("sleep-weights", "no")
    if weights not in ("yes", "no"):
        raise ConfigError(f"--tenant {name}: sleep-weights={weights!r}: yes or no")
    if "+" in values.get("slo", "") and not all(part.strip() for part in values["slo"].split("+")):
        raise ConfigError(f"--tenant {name}: slo={values['slo']}: an empty objective between '+' (objectives are "
                          "joined by '+', e.g. slo=ttft_p99=2s+tpot_p99=100ms)")
    slo = values["slo"].replace("+", ",") if "slo" in values else None
    return {"floor_frac": floor, "ceiling_frac": ceiling, "sleep_after_us": sleep_after,
            "sleep_weights": weights == "yes", "slo": slo}
