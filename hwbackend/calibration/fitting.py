"""Least-squares fitting and fit errors shared by the compute-model fits (grid, tiled and in-loop)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def best_fit(residual: Callable[[np.ndarray], np.ndarray], starts, **options: Any) -> Any:
    """``scipy.optimize.least_squares(residual, start, **options)`` from each of ``starts``; the result of
    lowest cost (a rough guard against the local minima the ``max`` terms of a roofline create)."""
    from scipy.optimize import least_squares

    results = [least_squares(residual, np.asarray(start, dtype=float), **options) for start in starts]
    return min(results, key=lambda result: result.cost)


def fit_error(relative_errors: np.ndarray) -> dict:
    """Median / p90 / max of absolute relative errors (fractions)."""
    return {"median": round(float(np.median(relative_errors)), 4),
            "p90": round(float(np.percentile(relative_errors, 90)), 4),
            "max": round(float(np.max(relative_errors)), 4), "n": int(relative_errors.size)}
