"""TensorDict.map under faults: replaced memory-mapped files and workers killed with -9.

Workers that reopen a memory-mapped leaf by file name ("spawn", "forkserver",
and any caller-provided pool, whose tasks are pickled) must see exactly the
caller's data or raise; a caller-provided ``multiprocessing.Pool`` whose
worker dies must make ``map`` raise instead of waiting forever. Files are
written and replaced without tdfunc; every call that could hang runs under a
deadline.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import threading

import pytest
import torch
import torch.multiprocessing as torch_mp

from tdfunc import TensorDict
from tdfunc._distributed.map import StaleFileError, _Pickler, _Shipment

DEADLINE = 15.0
_REPLACEMENT: dict = {}  # set before the pool forks: where fn puts a newer file


# ---------------------------------------------------------------- worker functions
def total(data):
    return TensorDict({"s": data.get("x").sum(-1)}, data.batch_size)


def add_one_in_place(data):
    data.set_("x", data.get("x") + 1)


def replace_the_file_then_add_one(data):
    """The first chunk's worker edits its own (mapped) chunk in place, then saves a newer
    file under the same name, as a later save would. (Editing first: once the file is
    replaced, the caller may refuse its next chunk and end the pool before this worker
    gets any further.)"""
    path, values = _REPLACEMENT["path"], _REPLACEMENT["values"]
    add_one_in_place(data)
    if not os.path.exists(path + ".done"):
        _write(path + ".new", values)
        os.replace(path + ".new", path)
        open(path + ".done", "w").close()


def kill_on_item_5(data):
    if int(data.get("i")) == 5:
        os.kill(os.getpid(), signal.SIGKILL)


def nothing(data):
    return None


# ---------------------------------------------------------------- helpers
def _write(path: str, values: torch.Tensor) -> None:
    with open(path, "wb") as file:
        file.write(values.numpy().tobytes())


def _mapped(path: str, values: torch.Tensor) -> torch.Tensor:
    """``values`` in a file of its own, memory-mapped (no tdfunc)."""
    _write(path, values)
    storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=values.nbytes)
    return torch.empty(0, dtype=values.dtype).set_(storage, 0, values.shape, values.stride())


def _on_disk(path: str, like: torch.Tensor) -> torch.Tensor:
    with open(path, "rb") as file:
        raw = torch.frombuffer(bytearray(file.read()), dtype=like.dtype)
    return raw.view(like.shape)


def _bounded(call):
    """Run ``call()`` in a thread; fail (instead of hanging) past the deadline."""
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


def _dataset(tmp_path, n: int = 12):
    values = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)
    path = str(tmp_path / "x.bin")
    return TensorDict({"x": _mapped(path, values)}, [n]), values, path


# ---------------------------------------------------------------- replaced files
@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_spawn_workers_refuse_a_file_that_no_longer_holds_the_callers_data(tmp_path, how):
    data, values, path = _dataset(tmp_path)
    newer = torch.full_like(values, -1.0)
    if how == "replaced":  # a later save: a new file renamed over the name
        _write(path + ".new", newer)
        os.replace(path + ".new", path)
    else:
        os.remove(path)
    assert torch.equal(data["x"], values)  # the caller still maps its own data
    with pytest.raises(StaleFileError, match=r"x\.bin.*\(at key 'x'\)"):
        _bounded(lambda: data.map(total, num_workers=2, mp_start_method="spawn"))
    if how == "replaced":
        assert torch.equal(_on_disk(path, values), newer)  # the newer file is untouched
    else:
        assert not os.path.exists(path)  # not re-created (zero-filled) by a worker
    # forked workers inherit the caller's mapping: they see exactly its data
    out = _bounded(lambda: data.map(total, num_workers=2, mp_start_method="fork"))
    assert torch.equal(out["s"], values.sum(-1))


def test_a_caller_pool_refuses_a_replaced_file(tmp_path):
    data, values, path = _dataset(tmp_path)
    _write(path + ".new", torch.zeros_like(values))
    os.replace(path + ".new", path)
    with torch_mp.get_context("fork").Pool(2) as pool, pytest.raises(StaleFileError):
        _bounded(lambda: data.map(add_one_in_place, chunksize=4, pool=pool))
    assert torch.equal(_on_disk(path, values), torch.zeros_like(values))


def test_a_file_replaced_while_tasks_are_pending_is_refused_by_the_worker(tmp_path):
    data, values, path = _dataset(tmp_path)
    newer = torch.full_like(values, 7.0)
    _REPLACEMENT.update(path=path, values=newer)
    with torch_mp.get_context("fork").Pool(1) as pool, pytest.raises(StaleFileError):
        _bounded(lambda: data.map(replace_the_file_then_add_one, chunksize=3, pool=pool))
    assert torch.equal(_on_disk(path, values), newer)  # nothing written into the newer file
    # the first chunk was edited in the caller's own (old) file, which it still maps
    assert torch.equal(data["x"][:3], values[:3] + 1)


def test_worker_side_check_of_the_file_identity(tmp_path):
    data, values, path = _dataset(tmp_path)
    buffer = io.BytesIO()
    _Pickler(buffer, pickle.HIGHEST_PROTOCOL).dump(_Shipment(data))
    payload = buffer.getvalue()
    shipment = pickle.loads(payload)  # the same file: mapped again, same values
    assert shipment.error is None and torch.equal(shipment.collection["x"], values)
    _write(path + ".new", values * 2)
    os.replace(path + ".new", path)  # after it was sent, before a worker opens it
    refused = pickle.loads(payload)
    assert refused.collection is None
    assert "was replaced since it was sent" in refused.error


# ---------------------------------------------------------------- dead workers
def test_a_dead_worker_of_a_caller_pool_raises_instead_of_hanging():
    td = TensorDict({"i": torch.arange(10), "x": torch.zeros(10)}, [10])
    with torch_mp.get_context("fork").Pool(2) as pool:
        with pytest.raises(RuntimeError, match=r"worker process of the given pool died \(exit "):
            _bounded(lambda: td.map(kill_on_item_5, chunksize=0, pool=pool))
        # the pool replaced its worker: it still serves a later map
        out = _bounded(lambda: td.map(nothing, chunksize=2, pool=pool))
        assert out is td
