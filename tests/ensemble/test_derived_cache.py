"""The ensemble's cache of derived leaves, against the same derivations computed afresh.

Each case changes one thing the derived leaves depend on and checks that the
cache gives what ``BatchContext.extend`` (no cache) gives: the reference is
the derivation applied to the leaves as they are now.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tdfunc import Ensemble
from tdfunc._ensemble.cache import DerivedCache
from tdfunc._ensemble.registry import BatchContext


def _doubled(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * 2  # a copy: it does not see in-place edits


def _transposed(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.mT  # a view: it sees them


def _context() -> BatchContext:
    context = BatchContext(3)
    for position in range(3):
        context.derived(_doubled, position)
    context.derived(_transposed, 0)
    return context


def _leaves() -> tuple:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, generator=generator).requires_grad_(i != 1) for i in range(3))


def _same(cached: tuple, leaves: tuple, context: BatchContext) -> None:
    expected = context.extend(leaves)
    assert len(cached) == len(expected)
    for got, want in zip(cached, expected):
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad


def test_reused_while_nothing_changed():
    cache, context, leaves = DerivedCache(), _context(), _leaves()
    first = cache.extend(context, leaves)
    assert cache.extend(context, tuple(leaves)) is first
    _same(first, leaves, context)


def test_every_change_it_depends_on_gives_a_new_entry():
    cache, context, leaves = DerivedCache(), _context(), _leaves()
    cache.extend(context, leaves)
    with torch.no_grad():  # an in-place edit of a leaf whose derived tensor is a copy
        leaves[2].add_(1)
    _same(cache.extend(context, leaves), leaves, context)
    leaves[1].requires_grad_(True)  # unfrozen
    _same(cache.extend(context, leaves), leaves, context)
    leaves[0].data = torch.ones(2, 3)  # new storage, same object
    _same(cache.extend(context, leaves), leaves, context)
    replaced = (leaves[0], torch.zeros(2, 3), leaves[2])  # another object
    _same(cache.extend(context, replaced), replaced, context)


def test_grad_and_inference_modes_have_their_own_entries():
    cache, context, leaves = DerivedCache(), _context(), _leaves()
    with torch.no_grad():
        frozen = cache.extend(context, leaves)
    assert not frozen[3].requires_grad
    trained = cache.extend(context, leaves)
    assert trained[3].requires_grad and trained[3].grad_fn is not None
    with torch.inference_mode():
        inferred = cache.extend(context, leaves)
    assert inferred is not frozen and inferred is not trained
    with torch.no_grad():
        assert cache.extend(context, leaves) is frozen


def test_a_dispatch_mode_sees_the_derivations_and_nothing_is_cached_under_it():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    cache, context, leaves = DerivedCache(), _context(), _leaves()
    outside = cache.extend(context, leaves)
    with Record():
        inside = cache.extend(context, leaves)
        again = cache.extend(context, leaves)
    assert inside is not outside and again is not inside  # derived afresh, each time
    assert len(seen) >= 2 * len(context.derivations)  # every derivation ran under the mode
    _same(inside, leaves, context)
    assert cache.extend(context, leaves) is outside  # the entry made outside is kept


# ---------------------------------------------------------------- through an Ensemble
# Every route by which a stacked parameter can change between two calls, each
# followed by a call compared with the same members run one by one.


def _members_and_ensemble():
    from torch import nn

    from tdfunc import Ensemble

    torch.manual_seed(0)
    members = [
        nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        for _ in range(3)
    ]
    return Ensemble(*members), torch.randn(5, 4)


def _loop_reference(ensemble, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([ensemble.member(k)(x) for k in range(ensemble._num_members)])


def _check(ensemble, x: torch.Tensor) -> None:
    torch.testing.assert_close(ensemble(x), _loop_reference(ensemble, x))
    # a per-member input of rank 4 takes the Linear steps' reshaping branch
    xs = torch.randn(3, 2, 5, 4, dtype=x.dtype)
    expected = torch.stack([ensemble.member(k)(xs[k]) for k in range(3)])
    torch.testing.assert_close(ensemble(xs, in_dims=0), expected)


def test_every_mutation_route_is_seen_by_the_next_call():
    from torch.nn.utils import vector_to_parameters

    ensemble, x = _members_and_ensemble()
    _check(ensemble, x)
    weight = ensemble.stacked["2"].weight  # square: a transposed layout keeps its shape
    with torch.no_grad():
        weight.mul_(0.5)  # an in-place edit bumps the version
    _check(ensemble, x)
    weight.data.mul_(-1)  # through .data: no version bump, the cached views still see it
    _check(ensemble, x)
    weight.data = weight.data.mT.contiguous().mT  # same values, new storage and layout
    _check(ensemble, x)
    weight.data = weight.data.mT  # same storage, transposed layout (new values)
    _check(ensemble, x)
    # parameters_to_vector views each tensor; a Linear weight's memory is [N, in, out]
    vector = torch.cat([p.reshape(-1) for p in ensemble.parameters()])
    vector_to_parameters(vector * 2, ensemble.parameters())
    _check(ensemble, x)
    ensemble.requires_grad_(False)
    out = ensemble(x)
    assert not out.requires_grad
    ensemble.requires_grad_(True)
    ensemble(x).sum().backward()  # views made while frozen would leave .grad at None
    assert all(p.grad is not None for p in ensemble.parameters())
    ensemble.double()
    _check(ensemble, x.double())
    ensemble.float()
    _check(ensemble, x)
    state = {k: v * 3 for k, v in ensemble.state_dict().items()}
    ensemble.load_state_dict(state)
    _check(ensemble, x)
    ensemble.load_state_dict({k: v + 1 for k, v in state.items()}, assign=True)
    _check(ensemble, x)
    ensemble.stacked["0"].bias = torch.nn.Parameter(torch.zeros(3, 4))  # a new object
    _check(ensemble, x)


def test_routes_that_bypass_the_ensemble_itself_are_seen():
    """Changes made on a stacked submodule or a parameter directly, which the
    Ensemble's own methods never see: only the per-leaf signals catch them."""
    ensemble, x = _members_and_ensemble()
    _check(ensemble, x)
    ensemble.stacked["2"].double()  # a submodule's own .to(): Ensemble._apply never runs
    ensemble.stacked["2"].float()
    _check(ensemble, x)
    weight = ensemble.stacked["4"].weight
    with torch.no_grad():
        weight.set_(torch.randn(3, 2, 4))  # new memory under the same object
    _check(ensemble, x)
    with torch.no_grad():  # frozen while grad mode is off: that entry ignores the flag
        ensemble(x)
        ensemble.stacked["0"].weight.requires_grad_(False)
        _check(ensemble, x)
    ensemble(x).sum().backward()  # grad mode: the flag is read again
    assert ensemble.stacked["0"].weight.grad is None
    assert ensemble.stacked["0"].bias.grad is not None
    ensemble.stacked["0"].weight.requires_grad_(True)
    ensemble.zero_grad()
    ensemble(x).sum().backward()
    assert ensemble.stacked["0"].weight.grad is not None


def test_a_move_that_swaps_tensors_is_seen():
    """With torch's swap-on-conversion setting, ``.double()`` swaps each parameter's
    memory under the same Python object (``torch.utils.swap_tensors``), which torch
    refuses while another tensor (a cached view) holds the parameter."""
    ensemble, x = _members_and_ensemble()
    ensemble(x).sum().backward()
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        weight = ensemble.stacked["2"].weight
        ensemble.double()
        assert ensemble.stacked["2"].weight is weight and weight.dtype == torch.float64
        _check(ensemble, x.double())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def test_an_optimizer_step_keeps_the_cached_views_right():
    """Optimizer steps edit the parameters in place: the cached views see them, so
    the entry stays valid across steps (and the outputs follow the loop)."""
    ensemble, x = _members_and_ensemble()
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        ensemble(x).square().sum().backward()
        optimizer.step()
        _check(ensemble, x)
    entry = ensemble._derived.entries[1]
    ensemble(x)
    assert ensemble._derived.entries[1] is entry  # no rebuild after a step


class _ModeBranch(nn.Module):
    """Uses one layer in training and another in eval: the eval plan, built on the
    first eval call, adds derived leaves to the context the training entry was made in."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x) if self.training else self.b(x)


def test_a_plan_that_adds_derived_leaves_is_not_served_the_shorter_entry():
    torch.manual_seed(0)
    models = [_ModeBranch() for _ in range(3)]
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 4)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for train in (True, False, True, False):
                ensemble.train(train)
                for model in models:
                    model.train(train)
                expected = torch.stack([model(x) for model in models])
                torch.testing.assert_close(ensemble(x), expected)
