"""Request/reply messages between the coordinator (rank 0) and one tensor-parallel peer over a
:func:`multiprocessing.Pipe` connection (processes, or threads in tests). No torch.

A message is ``(command, args, reply)``; the server answers ``("ok", value)`` or ``("err", error)`` when
``reply`` is true and nothing otherwise (``post``: the forward of an iteration, which the coordinator never
waits for). Errors cross the pipe as themselves where they pickle (:class:`hwbackend.vmm.driver.VmmError`
is registered for it), else as :class:`RemoteError` naming the original type.
"""
from __future__ import annotations

import copyreg
import pickle
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hwbackend.vmm.driver import VmmError


class RemoteError(RuntimeError):
    """An error raised on a peer whose own type could not cross the pipe (message: ``Type: text``)."""


class PeerLostError(RuntimeError):
    """The peer closed its end of the pipe (it exited or crashed) before answering."""


def _reduce_vmm_error(error: VmmError) -> tuple:
    return VmmError, (error.call, error.error_name, error.call_args, error.detail)


copyreg.pickle(VmmError, _reduce_vmm_error)


def portable_error(error: BaseException) -> BaseException:
    """``error`` itself if it survives pickling, else a :class:`RemoteError` with its type, text and the
    peer's traceback as a note."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        portable = RemoteError(f"{type(error).__name__}: {error}")
        portable.add_note("".join(traceback.format_exception(error)).rstrip())
        return portable


class Channel:
    """The client end: one command at a time (a lock), in order.

    Args:
        conn: a :class:`multiprocessing.connection.Connection`. name: for messages (``peer 1``).
    """

    def __init__(self, conn: Any, name: str = "peer"):
        self.conn, self.name = conn, name
        self._lock = threading.Lock()
        self._pending = 0  # replies begun but not yet finished

    def call(self, command: str, *args: Any) -> Any:
        """Send ``command(*args)`` and wait for its result (the peer's error re-raised here)."""
        with self._lock:
            self._send(command, args, True)
            return self._receive()

    def call_within(self, timeout_s: float, command: str, *args: Any) -> Any:
        """:meth:`call` that gives up (TimeoutError) when no reply came within ``timeout_s`` (the channel is
        then out of step: use it only to stop a peer)."""
        with self._lock:
            self._send(command, args, True)
            if not self.conn.poll(timeout_s):
                raise TimeoutError(f"{self.name} did not answer {command!r} within {timeout_s:g} s")
            return self._receive()

    def post(self, command: str, *args: Any) -> None:
        """Send ``command(*args)`` without waiting; the peer sends no reply."""
        with self._lock:
            self._send(command, args, False)

    def begin(self, command: str, *args: Any) -> None:
        """Send ``command(*args)``; :meth:`finish` collects its reply (work on both sides at once)."""
        with self._lock:
            self._send(command, args, True)
            self._pending += 1

    def finish(self) -> Any:
        """The reply of the oldest :meth:`begin` (its error re-raised)."""
        with self._lock:
            if not self._pending:
                raise RuntimeError(f"{self.name}: no command begun")
            self._pending -= 1
            return self._receive()

    def close(self) -> None:
        self.conn.close()

    def _send(self, command: str, args: tuple, reply: bool) -> None:
        try:
            self.conn.send((command, args, reply))
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            raise PeerLostError(f"{self.name} is gone (sending {command!r}: {exc})") from exc

    def _receive(self) -> Any:
        try:
            status, value = self.conn.recv()
        except (EOFError, ConnectionError, OSError) as exc:
            raise PeerLostError(f"{self.name} closed the connection before answering") from exc
        if status == "err":
            raise value
        return value


def serve(conn: Any, handlers: Mapping[str, Callable[..., Any]], stop: tuple[str, ...] = ("shutdown",)) -> str:
    """Answer messages on ``conn`` with ``handlers`` until a command of ``stop`` (answered first) or the other
    end closes; returns the stopping command, or ``"eof"``.

    An error in a command that wants a reply goes back to the caller; an error in a posted command (no reply)
    is raised here: the peer cannot carry on out of step with the coordinator.
    """
    while True:
        try:
            command, args, reply = conn.recv()
        except (EOFError, ConnectionError, OSError):
            return "eof"
        handler = handlers.get(command)
        try:
            if handler is None:
                raise ValueError(f"unknown command {command!r}")
            answer = ("ok", handler(*args))
        except Exception as exc:
            if not reply:
                raise
            answer = ("err", portable_error(exc))
        if reply:
            try:
                conn.send(answer)
            except (BrokenPipeError, ConnectionError, OSError):
                return "eof"
            except Exception as exc:  # the value does not pickle: nothing was written, answer with the error
                conn.send(("err", portable_error(exc)))
        if command in stop:
            return command
