"""Handles of asynchronous communications, and the channels that order them.

gloo matches receives in the order they are posted, and a receive can only be
sized once its header has arrived; so the receives of one channel (group,
source, tag) run one after the other, on a helper thread (``irecv``) or inline
(``recv``). gloo's send handles report completion only once waited on, and a
dropped one cancels its send: ``isend`` handles are waited on by a helper
thread, which keeps the send alive and makes ``is_completed`` meaningful.
"""

from __future__ import annotations

import collections
import datetime
import threading
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch


class DistributedWork:
    """Handle of an asynchronous tdfunc communication (``isend``, ``irecv``, ``async_op=True``).

    Call :meth:`wait` before reading a received TensorDict or writing to a sent
    one. Errors of the communication (a structure mismatch, a timeout) are
    raised by :meth:`wait`.

    Example:
        >>> # rank 1: work = td.isend(dst=0); ...; work.wait()
        >>> # rank 0: work = td.irecv(src=1); ...; work.wait()  # td now holds the data
    """

    __slots__ = ("_api", "_done", "_error", "_finish", "_lock", "_observed", "_result", "_works")

    def __init__(self, api: str, works: list | None = None, finish: Callable | None = None):
        self._api = api
        self._works = works  # None: completed by a channel job (see _Channel)
        self._finish = finish
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._result: Any = None
        self._observed = False

    def _run(self, fn: Callable) -> None:
        try:
            self._result = fn()
        except BaseException as error:
            self._error = error
        finally:
            self._done.set()

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the communication completed (and the data is in place); returns True.

        Args:
            timeout: seconds (or a ``timedelta``) to wait at most; ``None`` waits up to
                the process group's timeout. Past it, ``TimeoutError`` is raised.
        """
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if self._works is not None:
            self._wait_works(seconds)
        elif not self._done.wait(seconds):
            raise TimeoutError(
                f"TensorDict.{self._api}: not completed within {seconds} s; the peer may not "
                f"have posted the matching operation yet."
            )
        self._observed = True
        if self._error is not None:
            raise self._error
        return True

    def _wait_works(self, seconds: float | None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            try:
                for work in self._works or ():
                    if seconds is None:
                        work.wait()
                    else:
                        work.wait(datetime.timedelta(seconds=seconds))
                if self._finish is not None:
                    self._finish()
            except BaseException as error:
                if seconds is not None and "timed out" in str(error).lower():
                    # not completed yet, not failed: a later wait() may still succeed
                    raise TimeoutError(
                        f"TensorDict.{self._api}: not completed within {seconds} s."
                    ) from error
                self._error = error
            self._done.set()

    def is_completed(self) -> bool:
        """True when :meth:`wait` would return (or raise) without blocking."""
        return self._done.is_set()

    def source_rank(self) -> int | None:
        """For a completed receive: the rank that sent the data (``None`` otherwise)."""
        return self._result

    def __del__(self) -> None:
        if self._error is not None and not self._observed:
            warnings.warn(
                f"TensorDict.{self._api} failed in the background and its handle was never "
                f"waited on: {self._error}",
                RuntimeWarning,
                stacklevel=1,
            )

    def __repr__(self) -> str:
        state = "completed" if self.is_completed() else "pending"
        return f"DistributedWork({self._api}, {state})"


class _Channel:
    """Jobs on one (group, direction, peer, tag) run in the order they were submitted."""

    __slots__ = ("_scratch", "draining", "jobs", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: collections.deque = collections.deque()
        self.draining = False
        self._scratch: torch.Tensor | None = None

    def scratch(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A receive buffer reused by the jobs of this channel (they never overlap)."""
        buffer = self._scratch
        if buffer is None or buffer.numel() != nbytes or buffer.device != device:
            buffer = self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buffer

    def submit(self, work: DistributedWork, fn: Callable) -> None:
        """Run ``fn(channel)`` after the jobs already submitted, on a helper thread."""
        with self.lock:
            self.jobs.append((work, fn))
            start = not self.draining
            self.draining = True
        if start:
            self._start_drainer()

    def run_now(self, fn: Callable) -> Any:
        """Run ``fn(channel)`` in the caller's thread, after the jobs already submitted."""
        with self.lock:
            idle = not self.draining
            self.draining = True
        if not idle:  # queue behind the pending jobs and wait for our turn
            work = DistributedWork("recv")
            self.submit(work, fn)  # the running drainer picks it up
            work.wait()
            return work._result
        try:
            return fn(self)
        finally:
            with self.lock:
                self.draining = bool(self.jobs)
            if self.draining:  # jobs submitted meanwhile
                self._start_drainer()

    def _start_drainer(self) -> None:
        threading.Thread(target=self._drain, name="tdfunc-p2p", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self.lock:
                if not self.jobs:
                    self.draining = False
                    return
                work, fn = self.jobs.popleft()
            work._run(partial(fn, self))


_CHANNELS: dict = {}
_CHANNELS_LOCK = threading.Lock()
_POST_LOCK = threading.Lock()


def _channel(group: Any, direction: str, peer: int | None, tag: int) -> _Channel:
    key = (id(group), direction, peer, tag)
    with _CHANNELS_LOCK:
        channel = _CHANNELS.get(key)
        if channel is None:
            channel = _CHANNELS[key] = _Channel()
        return channel
