"""``map`` with a caller's ``multiprocessing.Pool`` whose worker exits raises the documented
``RuntimeError``, also in a process that never imported ``concurrent.futures.process``
(only tdfunc's own pool imports it; the error path must not depend on that)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import threading

import pytest
import torch

from tdfunc import TensorDict

DEADLINE = 9.0


def exit_on_item_3(data):
    if int(data.get("i")) == 3:
        os._exit(1)


def _bounded(call):
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    assert not thread.is_alive(), f"still running after {DEADLINE} s (a hang)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_worker_that_exits_raises_runtime_error_without_concurrent_futures_process(
    monkeypatch,
):
    # as in a fresh interpreter: the submodule is neither imported nor an attribute
    monkeypatch.delitem(sys.modules, "concurrent.futures.process", raising=False)
    monkeypatch.delattr(concurrent.futures, "process", raising=False)
    td = TensorDict({"i": torch.arange(8), "x": torch.zeros(8)}, [8])
    with multiprocessing.get_context("fork").Pool(2) as pool:
        with pytest.raises(RuntimeError, match=r"worker process of the given pool died \(exit "):
            _bounded(lambda: td.map(exit_on_item_3, chunksize=0, pool=pool))
