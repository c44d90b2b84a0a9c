"""Real processes for distributed tests: ranks on 127.0.0.1 (gloo), joined with deadlines.

Two launchers: :func:`launch` spawns fresh ranks (a failing rank fails the test:
the message tests), :func:`run_ranks` forks ranks that report back (the
fault-injection tests).

Unlike ``torch.multiprocessing.start_processes``, a rank that dies (``kill -9``,
on purpose) does not take the others down: every rank reports what happened
through a queue, and the caller asserts on each. Ranks are forked (the
parent's imports are reused: a ``spawn`` costs seconds per process), and every
join has a deadline, so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, queue: Any, timeout: float) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    status, value = "error", "did not start"
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
        status, value = "ok", fn(rank)
    except BaseException as error:  # reported to the parent, which decides
        status, value = "error", (type(error).__name__, str(error), traceback.format_exc())
    queue.put((rank, status, value))
    queue.close()
    queue.join_thread()
    os._exit(0)  # no process-group teardown: a dead peer would make it wait


class Outcome:
    """What each rank did: ``results[rank]`` is ``("ok", value)`` or ``("error", (type, text,
    traceback))``; ``exitcodes[rank]`` is ``-9`` for a rank killed by SIGKILL."""

    def __init__(self, results: dict, exitcodes: list, hung: list, seconds: float) -> None:
        self.results = results
        self.exitcodes = exitcodes
        self.hung = hung
        self.seconds = seconds

    def value(self, rank: int) -> Any:
        status, value = self.results.get(rank, ("error", ("Missing", "no report", "")))
        if status != "ok":
            raise AssertionError(f"rank {rank} failed: {value[0]}: {value[1]}\n{value[2]}")
        return value

    def error(self, rank: int) -> tuple[str, str]:
        status, value = self.results.get(rank, ("ok", None))
        if status != "error":
            raise AssertionError(f"rank {rank} did not fail; it returned {value!r}")
        return value[0], value[1]


def run_ranks(
    fn: Callable[[int], Any],
    world: int = 2,
    timeout: float = 5.0,
    deadline: float = 18.0,
    wait_for: tuple | None = None,
) -> Outcome:
    """Run ``fn(rank)`` on ``world`` forked ranks (process-group timeout ``timeout`` s).

    Waits at most ``deadline`` s in all for the ranks in ``wait_for`` (default:
    all); ranks still alive then are killed, and those of ``wait_for`` are
    listed in ``Outcome.hung`` (a rank stopped on purpose need not be waited for).
    """
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_entry, args=(rank, world, port, fn, queue, timeout), daemon=True)
        for rank in range(world)
    ]
    started = time.monotonic()
    for process in processes:
        process.start()
    end = started + deadline
    try:
        awaited = range(world) if wait_for is None else wait_for
        for rank in awaited:
            processes[rank].join(max(0.0, end - time.monotonic()))
        hung = [rank for rank in awaited if processes[rank].is_alive()]
        results: dict = {}
        while len(results) < len(awaited):
            try:
                rank, status, value = queue.get(timeout=0.2)
            except Exception:  # queue.Empty: a rank that died or hung reports nothing
                break
            results[rank] = (status, value)
        seconds = time.monotonic() - started
        return Outcome(results, [p.exitcode for p in processes], hung, seconds)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(1.0)


# ---------------------------------------------------------------- spawned ranks
GROUP_TIMEOUT = datetime.timedelta(seconds=60)


def _spawned_entry(rank: int, fn: Callable, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)
    try:
        fn(rank, world_size)
        dist.barrier()
    except BaseException:
        # the other ranks then fail with "connection closed": show the root cause
        print(f"---- rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        raise
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[[int, int], Any], world_size: int, timeout: float = 150.0) -> None:
    """Run ``fn(rank, world_size)`` on fresh (spawned) processes; a failing rank fails the test."""
    context = mp.start_processes(
        _spawned_entry,
        args=(fn, world_size, free_port()),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world_size} ranks did not finish within {timeout} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


# ---------------------------------------------------------------- one fresh interpreter
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_fresh(source: str, timeout: float = 120.0) -> Any:
    """Run ``source`` in a new interpreter (nothing imported, no cache filled) and return
    the JSON value it prints last: for behaviour that must not depend on what the
    process did before. The repository root comes first on ``sys.path``."""
    import json
    import subprocess

    env = {**os.environ, "PYTHONPATH": REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPOSITORY,
        env=env,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"the fresh process failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])
