"""How hyperparameters enter: matched by key path, range-checked only as Python numbers.

References are plain tensors and ``torch.optim`` instances, one per parameter.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict, optim


def plain_sgd(params: dict, grads: dict, lrs: dict) -> dict:
    return {key: params[key] - lrs[key] * grads[key] for key in params}


@pytest.mark.parametrize("container", [dict, TensorDict])
def test_per_leaf_lr_is_matched_by_key_not_position(container):
    params = container({"w": torch.ones(3), "b": torch.full((3,), 2.0)})
    grads = container({"w": torch.ones(3), "b": torch.ones(3)})
    lrs = {"b": torch.tensor(0.5), "w": torch.tensor(0.1)}  # another order than params
    opt = optim.sgd(lr=lrs)
    updates, _ = opt.update(grads, opt.init(params), params)
    new = optim.apply_updates(params, updates)
    expected = plain_sgd(dict(params.items()), dict(grads.items()), lrs)
    for key in ("w", "b"):
        torch.testing.assert_close(new[key], expected[key])


def test_nested_per_leaf_lr_in_another_order_and_container():
    params = TensorDict({"a": torch.ones(2), "n": {"x": torch.ones(2), "y": torch.ones(2)}})
    lrs = {"n": {"y": torch.tensor(0.3), "x": torch.tensor(0.2)}, "a": torch.tensor(0.1)}
    opt = optim.adam(lr=lrs)
    updates, _ = opt.update(params.apply(torch.ones_like), opt.init(params), params)
    # Adam's first step moves every entry by lr (sign of the gradient)
    assert updates["a"].tolist() == pytest.approx([-0.1, -0.1])
    assert updates["n", "x"].tolist() == pytest.approx([-0.2, -0.2])
    assert updates["n", "y"].tolist() == pytest.approx([-0.3, -0.3])


@pytest.mark.parametrize(
    ("lrs", "message"),
    [
        ({"w": torch.tensor(0.1)}, r"no value for the parameters \"\['b'\]\""),
        (
            {"w": torch.tensor(0.1), "b": torch.tensor(0.1), "c": torch.tensor(0.1)},
            r"values for \"\['c'\]\", which name no parameter",
        ),
        ({"w": torch.tensor(0.1), "x": torch.tensor(0.1)}, r"no value .*'b'.* and values .*'x'"),
    ],
)
def test_per_leaf_lr_with_missing_or_extra_keys_is_refused(lrs, message):
    params = {"w": torch.ones(2), "b": torch.ones(2)}
    opt = optim.sgd(lr=lrs)
    with pytest.raises(ValueError, match=message):
        opt.update(params, opt.init(params), params)


def test_learned_negative_step_sizes_are_used_not_refused():
    # a meta-learned step size may go negative; tensors are not range-checked
    lr = torch.full((100, 300), -0.1)
    lr[0, 0] = 0.2
    params = {"w": torch.ones(100, 300)}
    opt = optim.sgd(lr={"w": lr})
    updates, _ = opt.update({"w": torch.ones(100, 300)}, opt.init(params), params)
    torch.testing.assert_close(updates["w"], -lr)


@pytest.mark.parametrize(
    "build",
    [
        lambda lr: optim.sgd(lr=lr),
        lambda lr: optim.adam(lr=lr),
        lambda lr: optim.SGD([torch.nn.Parameter(torch.ones(3, 2))], lr=lr),
        lambda lr: optim.Adam([torch.nn.Parameter(torch.ones(3, 2))], lr=lr),
    ],
)
def test_tensor_hyperparameters_of_any_sign_are_accepted(build):
    build(torch.tensor([0.1, -0.2, 0.3]))
    build(torch.tensor([0.1, -0.2, 0.3], requires_grad=True))


def test_python_numbers_are_range_checked_with_a_short_message():
    with pytest.raises(ValueError, match=r"^tdfunc.optim.sgd: lr must be >= 0.0, got -0.1.$"):
        optim.sgd(lr=-0.1)
    with pytest.raises(ValueError, match=r"^SGD: momentum must be >= 0.0, got -1.0.$"):
        optim.SGD([torch.nn.Parameter(torch.ones(2))], momentum=-1.0)


def test_a_huge_bad_pytree_leaf_gives_a_short_message():
    with pytest.raises(TypeError) as error:
        optim.sgd(lr={"w": torch.arange(30_000)})
    assert len(str(error.value)) < 300


@pytest.mark.parametrize(
    ("build", "name", "value"),
    [
        (lambda: optim.sgd(lr=0.1), "lr", -1.0),
        (lambda: optim.adam(lr=0.1), "beta1", 1.0),
        (lambda: optim.rmsprop(lr=0.1), "alpha", 2.0),
    ],
)
def test_numbers_written_into_hyperparameters_are_checked_at_the_next_update(build, name, value):
    opt = build()
    params = {"w": torch.ones(2)}
    state = opt.init(params)
    opt.hyperparameters[name] = value
    with pytest.raises(ValueError, match=rf"update: {name} must be >= 0.0"):
        opt.update({"w": torch.ones(2)}, state, params)
