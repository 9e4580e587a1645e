"""Transactions with rollback for multi-step driver sequences (the ``cuda.core`` pattern, style.md #9).

A transaction is an :class:`contextlib.ExitStack` of undo actions. Each step that changes driver or
bookkeeping state registers its inverse right after it succeeds; leaving the ``with`` block normally
commits (the undo log is dropped), leaving it with an exception runs the undo actions in reverse order
and re-raises the original exception::

    with Transaction() as tx:
        va = driver.reserve(size_bytes)
        tx.on_rollback(driver.free_address, va, size_bytes)
        handle = driver.create(size_bytes)
        tx.on_rollback(driver.release, handle)
        driver.map(va, size_bytes, handle)       # raises -> release(handle), free_address(va) run
        tx.on_rollback(driver.unmap, va, size_bytes)

An undo action that itself fails does not hide the original error: its failure is added to the original
exception as a note (``BaseException.add_note``) and the remaining undo actions still run.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import Any


class Transaction:
    """An undo log over :class:`contextlib.ExitStack`; commits on normal exit, rolls back on exception.

    Attributes:
        rollback_errors: failures of undo actions seen during the last rollback (empty when clean).
    """

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.rollback_errors: list[BaseException] = []

    def __enter__(self) -> "Transaction":
        self._stack.__enter__()
        return self

    def on_rollback(self, undo: Callable[..., Any], *args: Any) -> None:
        """Register ``undo(*args)``, run only if the transaction rolls back (last registered runs first)."""
        self._stack.callback(self._guarded, undo, args)

    def _guarded(self, undo: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            undo(*args)
        except Exception as exc:  # keep undoing: one failed undo must not leak the rest
            self.rollback_errors.append(exc)

    def commit(self) -> None:
        """Drop the undo log: what was done stays done."""
        self._stack.pop_all()

    def rollback(self) -> None:
        """Run the undo actions now, in reverse order of registration."""
        self._stack.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None:
            self.commit()
            return False
        self.rollback()
        for error in self.rollback_errors:
            exc.add_note(f"rollback step failed too: {error!r}")
        return False
