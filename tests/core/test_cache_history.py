"""What a call accepts does not depend on what the process did before.

tdfunc keeps small caches keyed on user values (validated batch sizes, constants of
the optimizers' bias corrections). A key compared with ``==`` would let a value
that only compares equal to an accepted one (``3.0``, ``Decimal(3)``, ``3+0j``,
``-0.0`` for ``0``) borrow its result. Each case runs the refused value, then the
accepted one, then the refused one again, in a fresh interpreter (empty caches)
and in this process (caches filled by the tests before), and expects the same
answer every time.
"""

from __future__ import annotations

import pytest
from process_harness import run_fresh

BATCH_SIZE_PROBE = """
import decimal, fractions, json
import numpy as np
import torch
from tdfunc import TensorClass, TensorDict


class Point(TensorClass):
    x: torch.Tensor


def set_size(value, n):
    td = TensorDict({}, [])
    td.batch_size = [value]
    return td


DOORS = {
    "constructor, list": lambda v, n: TensorDict({"a": torch.zeros(n)}, [v]),
    "constructor, tuple": lambda v, n: TensorDict({"a": torch.zeros(n)}, (v,)),
    "constructor, device": lambda v, n: TensorDict({"a": torch.zeros(n)}, [v], device="cpu"),
    "constructor, empty": lambda v, n: TensorDict({}, [v, v]),
    "batch_size setter": set_size,
    "TensorClass": lambda v, n: Point(x=torch.zeros(n), batch_size=[v]),
}
PAIRS = {  # a refused value, and the accepted value it compares equal to
    "3.0": (3.0, 3),
    "Decimal(3)": (decimal.Decimal(3), 3),
    "Fraction(3)": (fractions.Fraction(3), 3),
    "3+0j": (3 + 0j, 3),
    "np.float64(3)": (np.float64(3.0), 3),
    "-0.0": (-0.0, 0),
}


def outcome(door, value, n):
    try:
        return list(door(value, n).batch_size)
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def probe():
    report = {}
    for door_name, door in DOORS.items():
        for pair_name, (refused, accepted) in PAIRS.items():
            report[f"{door_name} / {pair_name}"] = [
                outcome(door, refused, accepted),
                outcome(door, accepted, accepted),
                outcome(door, refused, accepted),
            ]
    return report
"""


def check_batch_size_report(report: dict) -> None:
    assert len(report) == 36
    for case, (before, accepted, after) in report.items():
        assert isinstance(accepted, list), (case, accepted)
        assert isinstance(before, str) and before.startswith("TypeError"), (case, before)
        assert after == before, (case, before, after)


def test_batch_sizes_refused_in_a_fresh_process_stay_refused_after_equal_ones():
    check_batch_size_report(run_fresh(BATCH_SIZE_PROBE + "\nprint(json.dumps(probe()))"))


def test_batch_sizes_refused_stay_refused_in_this_process():
    namespace: dict = {"__name__": "batch_size_probe"}
    exec(compile(BATCH_SIZE_PROBE, "batch_size_probe", "exec"), namespace)
    check_batch_size_report(namespace["probe"]())


def test_accepted_non_int_items_give_the_same_size_warm_or_cold():
    # A bool and a NumPy int are accepted by torch.Size (as 1 and 3): they are
    # not cached, and give the same batch size before and after the ints.
    source = """
import json
import numpy as np
import torch
from tdfunc import TensorDict
sizes = []
for value in (True, np.int64(3), torch.tensor(3), 1, 3, True, np.int64(3), torch.tensor(3)):
    n = int(value)
    sizes.append([int(s) for s in TensorDict({"a": torch.zeros(n)}, [value]).batch_size])
print(json.dumps(sizes))
"""
    assert run_fresh(source) == [[1], [3], [3], [1], [3], [1], [3], [3]]


ADAM_PROBE = """
import json
import torch
import tdfunc.optim


def steps(betas, cls, seed=0):
    torch.manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = cls([w], lr=0.1, betas=betas)
    for _ in range(4):
        opt.zero_grad()
        (w.sin() * torch.arange(5.0, dtype=torch.float64)).sum().backward()
        opt.step()
    return w.detach()


def probe():
    out = []
    for betas in ((0.0, 0.0), (-0.0, -0.0), (0.0, 0.0)):
        mine, reference = steps(betas, tdfunc.optim.Adam), steps(betas, torch.optim.Adam)
        out.append(
            torch.equal(mine, reference) and torch.equal(mine.signbit(), reference.signbit())
        )
    return out
"""


@pytest.mark.parametrize("where", ["fresh process", "this process"])
def test_adam_bias_correction_constants_do_not_depend_on_the_sign_of_a_zero_beta(where):
    # The correction constants are cached per (beta1, beta2); -0.0 and 0.0 share a
    # key, which is only right because they give the same corrections: the steps
    # must equal torch.optim.Adam's in either order.
    if where == "fresh process":
        result = run_fresh(ADAM_PROBE + "\nprint(json.dumps(probe()))")
    else:
        namespace: dict = {"__name__": "adam_probe"}
        exec(compile(ADAM_PROBE, "adam_probe", "exec"), namespace)
        result = namespace["probe"]()
    assert result == [True, True, True]
