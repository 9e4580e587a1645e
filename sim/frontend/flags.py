"""The command line's names for the simulation's fields: an error of the core names the configuration field it
refuses (``token_budget=0: must be >= 1``, with the field in ``exc.fields``:
:class:`sim.setup.specs.FieldError`); a command line shows the flag its user typed instead
(``--token-budget 0: must be >= 1 (token_budget)``), a policy spec its key
(:func:`sim.frontend.policy_spec.policy_config_error`).

The flag of a field is read from the command line's own argparse definitions: the option whose destination is
the field, or the destination :data:`FIELD_DESTS` gives where the two differ. A field that no option of the
parser sets keeps its name (a Python caller's, a policy key's or a profile's field).
"""
from __future__ import annotations

import argparse
import re

FIELD_DESTS = {"page_size_bytes": "page_size", "max_batch_slots": "max_batch", "max_context_tokens": "max_context",
               "memory_util_frac": "memory_util", "host_swap_bytes": "host_swap",
               "deferred_reclaim": "no_deferred_reclaim", "profile_path": "profile", "num_replicas": "replicas",
               "records_dir": "records", "kv_tiers": "kv_tier", "tier_write_policy": "kv_tier_write",
               "tier_load_policy": "kv_tier_load"}
"""Field -> the argparse destination of the option that sets it, where the two names differ (the one table of
the options front end: :func:`sim.frontend.options.config_from_args` reads these destinations). Not here:
``frontend_overhead_us``, whose flag ``--frontend-overhead-ms`` gives it in another unit (so a message in
microseconds keeps the field's name)."""


def parser_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Destination -> the first long option string of each visible option of ``parser`` and its sub-commands
    (a hidden deprecated alias sharing a destination is skipped)."""
    flags: dict[str, str] = {}
    pending = [parser]
    while pending:
        current = pending.pop(0)
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
                continue
            longs = [option for option in action.option_strings if option.startswith("--")]
            if longs and action.help != argparse.SUPPRESS:
                flags.setdefault(action.dest, longs[0])
    return flags


def flag_of(field_name: str, flags: dict[str, str]) -> str | None:
    """The flag that sets ``field_name`` among ``flags`` (:func:`parser_flags`), or ``None``."""
    return flags.get(FIELD_DESTS.get(field_name, field_name))


def flag_message(exc: BaseException, flags: dict[str, str], renames: dict[str, str] | None = None) -> str:
    """``exc``'s message with each field it names (``exc.fields``) written as its flag: ``field=value`` as
    ``--flag value``, a bare ``field`` as ``--flag``; the renamed fields whose name differs from their flag's
    follow in parentheses, so that the message still names them. ``flags``: :func:`parser_flags` of the command
    line; ``renames``: field -> flag replacing the parser's (a role's own ``--prefill-tp`` for ``tp``). A
    message without fields is returned as it is."""
    message = str(exc)
    named = []
    for field_name in getattr(exc, "fields", ()):
        flag = (renames or {}).get(field_name) or flag_of(field_name, flags)
        if flag is None or not re.search(rf"(?<![\w.-]){re.escape(field_name)}(?![\w-])", message):
            continue
        message = re.sub(rf"(?<![\w.-]){re.escape(field_name)}=", f"{flag} ", message)
        message = re.sub(rf"(?<![\w.-]){re.escape(field_name)}(?![\w=-])", flag, message)
        if flag != "--" + field_name.replace("_", "-"):
            named.append(field_name)
    return message + (f" ({', '.join(named)})" if named else "")


__all__ = ["FIELD_DESTS", "flag_message", "flag_of", "parser_flags"]
