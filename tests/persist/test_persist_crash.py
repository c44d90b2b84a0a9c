"""Processes: concurrent readers, writers killed with SIGKILL, a full file system.

Every test here uses real processes (``os.fork``) and real files; every wait has a
timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import ast
import errno
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tdfunc import TensorDict

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _generation(g: int) -> TensorDict:
    """Every leaf holds ``g``; small leaves (files of a few bytes), a larger one, and a
    level of many small leaves (sharing one data file)."""
    return TensorDict(
        {
            "big": torch.full((64, 512), float(g)),
            "small": torch.full((64,), g, dtype=torch.int64),
            "inner": {"x": torch.full((64, 3), float(g)), "deep": {"y": torch.full((64,), g)}},
            "tag": f"gen{g}",
            "obj": {g},  # a set: saved with torch.save in a .pt file
            "many": {f"w{i}": torch.full((64,), float(g)) for i in range(40)},
        },
        [64],
    )


def _generation_of(td: TensorDict) -> int:
    """The single generation ``td`` holds; raises AssertionError on a mix."""
    values = set()
    for key in td.keys(True, True):
        value = td[key]
        if isinstance(value, torch.Tensor):
            values |= set(value.unique().tolist())
        elif isinstance(value, set):
            values |= value
        else:
            values.add(int(value.removeprefix("gen")))
    assert len(values) == 1, f"a mix of generations: {sorted(values)}"
    return int(values.pop())


def _read_all(fd: int, timeout: float) -> bytes:
    out = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            return out
        out += chunk
    raise AssertionError("a child process did not finish in time")


def _reader(path: str, write_fd: int, stop_fd: int) -> None:
    """Child: load in a loop until ``stop_fd`` is readable; report what it saw.

    Each load must hold one generation; the first load is kept and must keep its
    values however many saves follow (no file it maps is ever written again).
    """
    torch.set_num_threads(1)
    counts = {"whole": 0, "busy": 0, "mix": 0, "changed": 0, "other": 0}
    first = None
    first_generation = None
    while not select.select([stop_fd], [], [], 0)[0]:
        try:
            loaded = TensorDict.load_memmap(path)
        except RuntimeError as error:  # the clear error for "saved to in a loop"
            counts["busy" if "kept changing" in str(error) else "other"] += 1
            continue
        except Exception as error:  # reported to the parent
            counts["other"] += 1
            os.write(write_fd, f"error {type(error).__name__}: {error}\n".encode())
            continue
        try:
            generation = _generation_of(loaded)
            counts["whole"] += 1
        except AssertionError:
            counts["mix"] += 1
            continue
        if first is None:
            first, first_generation = loaded, generation
        elif _generation_of(first) != first_generation:
            counts["changed"] += 1
    os.write(write_fd, repr(counts).encode())


def _writer(path: str, write_fd: int, start: int, count: int | None) -> None:
    """Child: save generations ``start``, ``start + 1``, ... reporting each commit."""
    torch.set_num_threads(1)
    generation = start
    while count is None or generation < start + count:
        _generation(generation).memmap(path)
        os.write(write_fd, generation.to_bytes(4, "little"))
        generation += 1


def _fork(target, *args) -> tuple[int, int]:
    """(pid, read end of a pipe the child writes its report to)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            target(*args[:1], write_fd, *args[1:])
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _start_reader(path: str) -> tuple[int, int, int]:
    stop_read, stop_write = os.pipe()
    pid, report = _fork(_reader, path, stop_read)
    os.close(stop_read)
    return pid, report, stop_write


def _stop_reader(pid: int, report: int, stop_write: int) -> dict:
    os.write(stop_write, b"x")
    os.close(stop_write)
    text = _read_all(report, 30).decode()
    os.close(report)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text
    lines = text.splitlines()
    assert not lines[:-1], lines[:-1]  # no unexpected error
    return ast.literal_eval(lines[-1])


def test_reader_sees_whole_generations_while_another_process_saves(tmp_path):
    path = str(tmp_path / "data")
    _generation(0).memmap(path)
    reader = _start_reader(path)
    time.sleep(0.2)
    writer, commits = _fork(_writer, path, 1, 60)
    reported = _read_all(commits, 60)
    os.close(commits)
    os.waitpid(writer, 0)
    time.sleep(0.2)
    counts = _stop_reader(*reader)
    assert len(reported) == 4 * 60
    assert counts["mix"] == 0 and counts["changed"] == 0 and counts["other"] == 0, counts
    assert counts["whole"] > 0, counts
    assert _generation_of(TensorDict.load_memmap(path)) == 60


def test_randomized_kill_9_of_a_writer_with_a_reader_loading_in_a_loop(tmp_path):
    """A writer saving in a loop is SIGKILLed at random points, many times, while another
    process loads in a loop: every load is one whole generation (or the clear "kept
    changing" error), and after each kill the directory holds the last committed
    generation or the one in flight."""
    rng = random.Random(12)
    path = str(tmp_path / "data")
    _generation(0).memmap(path)
    reader = _start_reader(path)
    previous = 0
    deadline = time.monotonic() + 12
    trials = 0
    while trials < 25 and time.monotonic() < deadline:
        trials += 1
        start = 1000 * trials
        writer, commits = _fork(_writer, path, start, None)
        time.sleep(rng.random() * 0.15)
        os.kill(writer, signal.SIGKILL)
        os.waitpid(writer, 0)
        reported = _read_all(commits, 10)
        os.close(commits)
        generation = _generation_of(TensorDict.load_memmap(path))
        if len(reported) >= 4:
            committed = int.from_bytes(reported[-4:], "little")
            assert committed <= generation <= committed + 1
        else:
            assert generation in (previous, start)
        previous = generation
    counts = _stop_reader(*reader)
    assert trials >= 5
    assert counts["mix"] == 0 and counts["changed"] == 0 and counts["other"] == 0, counts
    assert counts["whole"] > 0, counts
    # a save after the crashes removes what the killed writers left behind
    _generation(7).memmap(path)
    from tdfunc._persist.directory import wait_for_cleanup

    wait_for_cleanup()
    names = sorted(
        os.path.relpath(os.path.join(d, n), path) for d, _, ns in os.walk(path) for n in ns
    )
    # 5 data files (the 40 leaves of "many" share one), 1 .pt file, 4 meta.json
    assert len(names) == 10, names


# ---------------------------------------------------------------------------- full disk
_FULL_DISK_CHILD = textwrap.dedent(
    """
    import errno, sys, torch
    from tdfunc import TensorDict
    path, kind = sys.argv[1], sys.argv[2]
    TensorDict({"a": torch.ones(16, 16), "b": {"c": torch.ones(4)}}, []).memmap(path)
    big = torch.ones(1024, 1024)  # 4 MB: more than the file system holds
    leaf = {"transposed": big.t(), "expanded": torch.ones(1024, 1).expand(1024, 1024),
            "contiguous": big}[kind]
    try:
        TensorDict({"a": leaf, "b": {"c": torch.zeros(1024)}}, []).memmap(path)
    except OSError as error:
        print("errno", error.errno)
    else:
        print("saved")
    old = TensorDict.load_memmap(path)
    assert old["a"].shape == (16, 16) and bool((old["a"] == 1).all()), "old data lost"
    assert old["b", "c"].tolist() == [1.0] * 4, "old data lost"
    print("old intact")
    """
)


def _full_disk_command(directory: str, kind: str) -> tuple[list[str], int, object]:
    """A command running the child on a 1 MiB file system, the errno expected, preexec.

    A tmpfs of 1 MiB in a private mount namespace (``unshare``) where the machine
    allows it (``ENOSPC``); otherwise the child runs with ``RLIMIT_FSIZE`` of 1 MiB
    and ``SIGXFSZ`` ignored, so writes past it fail with ``EFBIG``: the same path
    through the code (an ``OSError`` from ``write``), a different errno.
    """
    script = os.path.join(directory, "child.py")
    with open(script, "w") as file:
        file.write(_FULL_DISK_CHILD)
    target = os.path.join(directory, "mnt")
    os.mkdir(target)
    unshare = shutil.which("unshare")
    probe = (
        [unshare, "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {target}"]
        if unshare
        else None
    )
    if probe and subprocess.run(probe, capture_output=True, timeout=10).returncode == 0:
        inner = f"mount -t tmpfs -o size=1m tmpfs {target} && exec {sys.executable} {script} "
        return [unshare, "-rm", "sh", "-c", inner + f"{target}/ckpt {kind}"], errno.ENOSPC, None

    def limit() -> None:  # pragma: no cover - runs in the child
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    return [sys.executable, script, f"{target}/ckpt", kind], errno.EFBIG, limit


@pytest.mark.parametrize("kind", ["transposed", "expanded", "contiguous"])
def test_full_file_system_is_an_oserror_and_keeps_the_old_checkpoint(tmp_path, kind):
    command, expected, preexec = _full_disk_command(str(tmp_path), kind)
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, preexec_fn=preexec, env=env
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7 is SIGBUS
    assert done.stdout.split() == ["errno", str(expected), "old", "intact"], done.stdout


def test_fsync_true_saves_and_loads(tmp_path):
    _generation(1).memmap(tmp_path / "d", fsync=True)
    _generation(2).memmap(tmp_path / "d", fsync=True)
    assert _generation_of(TensorDict.load_memmap(tmp_path / "d")) == 2
