"""Every way into an Ensemble's forward gives the members' numbers.

``__call__`` goes straight to ``Ensemble._run`` when nothing stands in between;
hooks, a subclass's ``forward``, ``torch.jit.trace``, ``torch.func`` transforms
and ``torch.compile`` take torch's full path, which ends in ``_run`` too. The
reference is the members run one by one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble

MEMBERS = 4


@pytest.fixture
def members_and_input():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)) for _ in range(MEMBERS)]
    return models, torch.randn(6, 3)


def _loop(models, x):
    return torch.stack([model(x) for model in models])


def test_module_hooks_see_the_call_and_its_in_dims(members_and_input):
    models, x = members_and_input
    ens = Ensemble(*copy.deepcopy(models))
    expected = _loop(models, x)
    seen = []
    handle = ens.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    torch.testing.assert_close(ens(x), expected)
    assert seen == [x.shape]
    handle.remove()
    handle = ens.register_forward_hook(
        lambda module, args, kwargs, out: out * 2 if kwargs.get("in_dims", 0) is None else out,
        with_kwargs=True,
    )
    torch.testing.assert_close(ens(x, in_dims=None), expected * 2)
    per_member = torch.randn(MEMBERS, 6, 3)
    torch.testing.assert_close(
        ens(per_member, in_dims=0),
        torch.stack([m(per_member[k]) for k, m in enumerate(models)]),
    )
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, out: out + 1 if module is ens else None
    )
    try:
        torch.testing.assert_close(ens(x), expected + 1)
    finally:
        handle.remove()
    torch.testing.assert_close(ens(x), expected)  # hooks gone: the direct path again


def test_a_subclass_forward_is_called(members_and_input):
    models, x = members_and_input

    class Scaled(Ensemble):
        def forward(self, x, in_dims=None):
            return 3 * super().forward(x, in_dims=in_dims)

    ens = Scaled(*copy.deepcopy(models))
    torch.testing.assert_close(ens(x), 3 * _loop(models, x))
    torch.testing.assert_close(copy.deepcopy(ens)(x), 3 * _loop(models, x))


# torch deprecates its own tracer; the ensemble must still trace right while it exists
@pytest.mark.filterwarnings("ignore:`torch.jit.trace.*` is deprecated:DeprecationWarning")
def test_jit_trace_records_the_parameters_not_cached_views(members_and_input):
    """Views cached by an eager call must not enter a trace: the tracer takes a
    tensor it did not see made for a constant (it refused, or froze the weights)."""
    models, x = members_and_input
    ens = Ensemble(*copy.deepcopy(models))
    ens(x)  # caches the derived views
    traced = torch.jit.trace(ens, (x,), check_trace=False)
    torch.testing.assert_close(traced(x), _loop(models, x))
    with torch.no_grad():
        ens.stacked[0].weight.mul_(2)
        for model in models:
            model[0].weight.mul_(2)
    torch.testing.assert_close(traced(x), _loop(models, x))  # reads the live parameters


def test_transforms_over_the_ensemble_leave_its_cache_clean(members_and_input):
    models, x = members_and_input
    ens = Ensemble(*copy.deepcopy(models))
    ens(x)
    batch = torch.randn(2, 6, 3)
    torch.testing.assert_close(
        torch.func.vmap(ens)(batch), torch.stack([_loop(models, batch[j]) for j in range(2)])
    )
    params = {name: p.detach() * 0 for name, p in ens.named_parameters()}
    out = torch.func.functional_call(ens, params, (x,))
    torch.testing.assert_close(out, torch.zeros_like(out))
    torch.testing.assert_close(ens(x), _loop(models, x))  # nothing made inside leaked out


def test_compiled_call_takes_one_frame_and_matches(members_and_input):
    models, x = members_and_input
    ens = Ensemble(*copy.deepcopy(models))
    frames = []

    def backend(graph, example_inputs):
        frames.append(graph)
        return graph

    compiled = torch.compile(ens, backend=backend, fullgraph=True)
    for step in range(3):
        x = torch.randn(6, 3, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(compiled(x), _loop(models, x))
    assert len(frames) == 1
    torch.testing.assert_close(ens(x), _loop(models, x))
