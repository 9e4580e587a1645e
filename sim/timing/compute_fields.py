"""The compute model's fields: their names, physical ranges and checks (:class:`sim.timing.compute.RooflineComputeModel`
and a profile's ``compute`` sections; re-exported by :mod:`sim.timing.compute`)."""
from __future__ import annotations

import json
import math
import numbers


SCALAR_FIELDS: dict[str, str] = {
    "flops_efficiency": "in (0, 1]", "bw_efficiency": "in (0, 1]", "attention_flops_efficiency": "in (0, 1]",
    "overhead_us": ">= 0", "paged_attention_factor": "> 0", "layout_attention_factor": "> 0",
    "mixed_tile_rows": ">= 0", "launch_floor_us": ">= 0", "decode_graphs": "0 or 1",
    "decode_overhead_us": ">= 0", "attention_bytes_factor": "> 0", "wave_us_per_token": ">= 0",
    "attention_block_us": ">= 0", "attention_key_us": ">= 0", "attention_prefill_key_us": ">= 0",
    "attention_slots": "> 0", "split_kv_slot_tokens": ">= 0", "split_kv_sms": "> 0", "split_kv_programs": ">= 0",
    "attention_tail_key_us": ">= 0", "attention_prefill_tail_key_us": ">= 0", "attention_tail_serial": "0 to 1",
    "allreduce_base_us": ">= 0", "allreduce_hop_us": ">= 0", "allreduce_bus_bytes_per_s": ">= 0",
    "launch_us_per_layer": ">= 0", "allreduce_launch_us": ">= 0", "allreduce_skew_us": ">= 0",
}
"""The scalar fields of :class:`RooflineComputeModel` with their physical range (times in us and rows
``>= 0``, factors ``> 0``, efficiencies in ``(0, 1]``: shares of the datasheet peak, the bounds
``kvsim calibrate --from-run`` fits within, ``hwbackend.calibration.inloop._BOUNDS``; ``decode_graphs`` a flag);
every value must be finite."""

TABLE_FIELDS = ("decode_batch_knots", "decode_batch_correction_us")
"""The list fields of :class:`RooflineComputeModel`: batch sizes (``> 0``, strictly increasing) and the
added time (us, any sign) at each, of one length."""


class ComputeFieldError(ValueError):
    """A compute-model field out of its type or range; ``str()`` is ``"<field> <problem>"``, so a caller can
    prefix the section it read the field from (``sim.core.runner.load_models``)."""

    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field, self.problem = field, problem

    def __str__(self) -> str:
        return f"{self.field} {self.problem}"


def show_value(value, limit: int = 60) -> str:
    """``value`` as JSON text (``"x"``, ``null``, ``[1]``, ``NaN``), cut to ``limit`` characters, for error
    messages about a JSON file's fields."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def finite_number(value) -> float | None:
    """``value`` as a finite float, or None for a non-number (``bool``, ``None`` and strings included), NaN,
    infinity, or an integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _unknown_fields(names: list[str]) -> ComputeFieldError:
    return ComputeFieldError(names[0], f"is not a compute-model field (unknown compute fields {names}; known: "
                                       f"{', '.join(sorted(SCALAR_FIELDS) + list(TABLE_FIELDS))})")


def check_compute_field(name: str, value) -> float | tuple[float, ...]:
    """Convert one value of a compute-model field (e.g. from a profile's ``compute_in_loop.params``) after
    checking its type and physical range (:data:`SCALAR_FIELDS`; for :data:`TABLE_FIELDS` a non-empty list of
    finite numbers, knots ``> 0`` and strictly increasing). The two tables' lengths are checked together by
    :class:`RooflineComputeModel`.

    Returns:
        A float (scalar fields; ``decode_graphs`` as 0.0 or 1.0, ``true``/``false`` accepted), or a tuple of
        floats (table fields).

    Raises:
        ComputeFieldError: an unknown field, a non-number (null, string, bool), NaN, infinity, or a value
            out of range; the message names the field and the value.
    """
    if name in TABLE_FIELDS:
        if not isinstance(value, (list, tuple)) or not value:
            raise ComputeFieldError(name, f"must be a list of numbers (at least one), got {show_value(value)}")
        numbers_ = [finite_number(x) for x in value]
        for index, (raw, number) in enumerate(zip(value, numbers_)):
            if number is None:
                raise ComputeFieldError(f"{name}[{index}]", f"must be a finite number, got {show_value(raw)}")
            if name == "decode_batch_knots" and number <= 0:
                raise ComputeFieldError(f"{name}[{index}]", f"must be a batch size > 0, got {show_value(raw)}")
        if name == "decode_batch_knots":
            for index in range(1, len(numbers_)):
                if numbers_[index] <= numbers_[index - 1]:
                    raise ComputeFieldError(name, f"must increase strictly, got {show_value(value)}")
        return tuple(numbers_)
    rule = SCALAR_FIELDS.get(name)
    if rule is None:
        raise _unknown_fields([name])
    if rule == "0 or 1":
        number = float(value) if isinstance(value, bool) else finite_number(value)
        if number not in (0.0, 1.0):
            raise ComputeFieldError(name, f"must be 0 or 1 (decodes as CUDA graphs), got {show_value(value)}")
        return number
    number = finite_number(value)
    bad = number is None or (number <= 0 if rule in ("> 0", "in (0, 1]") else number < 0) or (
        rule in ("0 to 1", "in (0, 1]") and number > 1)
    if bad:
        unit = (" (us)" if name.endswith("_us") else " (us per token)" if name == "wave_us_per_token"
                else " (a share of the GPU's datasheet peak)" if name.endswith("efficiency") else "")
        raise ComputeFieldError(name, f"must be a finite number {rule}{unit}, got {show_value(value)}")
    return number
