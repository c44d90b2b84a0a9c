"""The folding rule of chains, and what a hostile or careless user does with chains.

A scaling followed by the learning rate (AdamW: with the decay between them) runs
as one stage, so a chain gives its named optimizer's numbers; every other sequence
runs transform by transform, which is checked against applying the transforms one
at a time by hand.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from tdfunc import TensorDict, optim
from tdfunc.optim import _compose

N = 3
LRS = torch.tensor([0.1, 0.05, 0.2], dtype=torch.float64)


def tree(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    leaves = {"a": torch.randn(N, 4, generator=g, dtype=dtype)}
    leaves["b"] = torch.randn(N, 2, 3, generator=g, dtype=dtype)
    return TensorDict(leaves, batch_size=[N])


def run(opt, steps=3, members=None):
    params = tree(0)
    state = opt.init(params)
    for seed in range(1, steps + 1):
        updates, state = opt.update(tree(seed), state, params, members=members)
        params = optim.apply_updates(params, updates)
    return params, state


def one_at_a_time(transforms, steps=3):
    """Each transform's update applied in turn, by hand: the chain without any folding."""
    params = tree(0)
    states = [t.init(params) for t in transforms]
    for seed in range(1, steps + 1):
        updates = tree(seed)
        for index, t in enumerate(transforms):
            updates, states[index] = t.update(updates, states[index], params)
        params = optim.apply_updates(params, updates)
    return params


def roles(*names):
    stage = {
        "scale": _compose.Stage("s", (), None, _compose.SCALE),
        "adam": _compose.Stage("a", (), None, _compose.SCALE, folds_decay=True),
        "decay": _compose.Stage("d", (), None, _compose.DECAY),
        "lr": _compose.Stage("l", (), None, _compose.LEARNING_RATE),
        "other": _compose.Stage("o", (), None),
    }
    return tuple(stage[name] for name in names)


@pytest.mark.parametrize(
    ("names", "sizes"),
    [
        (("adam", "lr"), (2,)),
        (("adam", "decay", "lr"), (3,)),
        (("scale", "decay", "lr"), (1, 1, 1)),  # only Adam's rule folds decoupled decay
        (("decay", "adam", "lr"), (1, 2)),
        (("scale", "scale", "lr"), (1, 2)),
        (("adam", "other", "lr"), (1, 1, 1)),
        (("lr", "adam"), (1, 1)),
        (("adam", "decay"), (1, 1)),
        (("adam", "decay", "decay", "lr"), (1, 1, 1, 1)),
        ((), ()),
    ],
)
def test_the_folding_rule(names, sizes):
    assert _compose.fold(roles(*names)) == sizes


class Halve:
    """A transformation of the user's own (init/update), not a GradientTransformation."""

    def init(self, params):
        return ()

    def update(self, updates, state, params=None, *, members=None):
        return updates.apply(lambda u: u / 2), state


UNFOLDED = {
    "rms-then-decoupled-decay": lambda: (
        optim.scale_by_rms(),
        optim.add_decayed_weights(0.1),
        optim.scale_by_learning_rate(LRS),
    ),
    "user-transform-between": lambda: (
        optim.scale_by_adam(),
        Halve(),
        optim.scale_by_learning_rate(LRS),
    ),
    "clip-then-lr": lambda: (optim.clip_by_global_norm(0.5), optim.scale_by_learning_rate(0.1)),
    "lr-then-adam": lambda: (optim.scale_by_learning_rate(0.1), optim.scale_by_adam()),
}


@pytest.mark.parametrize("name", list(UNFOLDED))
def test_chains_the_rule_does_not_fold_run_transform_by_transform(name):
    transforms = UNFOLDED[name]()
    ours, _ = run(optim.chain(*transforms))
    expected = one_at_a_time(transforms)
    for key in ("a", "b"):
        assert torch.equal(ours[key], expected[key])


def test_a_folded_chain_differs_from_transform_by_transform_only_by_rounding():
    """The fold changes where lr is applied, not what is computed."""
    transforms = (optim.scale_by_adam(), optim.scale_by_learning_rate(LRS))
    folded, _ = run(optim.chain(*transforms))
    by_hand = one_at_a_time(transforms)
    named, _ = run(optim.adam(LRS))
    for key in ("a", "b"):
        assert torch.equal(folded[key], named[key])
        torch.testing.assert_close(folded[key], by_hand[key], rtol=1e-14, atol=1e-15)


def test_folded_stages_keep_their_own_step_counts_per_member():
    opt = optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(0.1),
                      optim.scale_by_learning_rate(LRS))  # fmt: skip
    mask = torch.tensor([True, False, True])
    _, state = run(opt, steps=2, members=mask)
    for part in state:
        assert part["step"].tolist() == [2.0, 0.0, 2.0]


def test_per_leaf_learning_rates_fold_like_the_named_optimizer():
    lr = {"b": torch.full((N, 1, 3), 0.05, dtype=torch.float64), "a": torch.tensor(0.1)}
    lr_td = TensorDict(lr)
    chained, _ = run(optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(lr)))
    named, _ = run(optim.adam(lr_td))
    for key in ("a", "b"):
        assert torch.equal(chained[key], named[key])


# ------------------------------------------------------------------ hostile hyperparameters
@pytest.mark.parametrize("value", [-0.1, float("nan"), float("-inf")])
def test_bad_python_learning_rates_are_refused_through_chain(value):
    with pytest.raises(ValueError, match=r"scale_by_learning_rate: lr must be >= 0\.0"):
        optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(value))


def test_a_negative_learned_learning_rate_is_taken_as_given():
    """A tensor is never range-checked (a learned step size may go negative)."""
    lr = torch.tensor([-0.1, 0.05, 0.2], dtype=torch.float64)
    chained, _ = run(optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(lr)))
    named, _ = run(optim.adam(lr))
    assert torch.equal(chained["a"], named["a"])
    assert (chained["a"][0] != tree(0)["a"][0]).all()


@pytest.mark.parametrize("shape", [(N + 1,), (1,), (N, 1), (N, 4, 1)])
def test_per_member_tensors_of_the_wrong_shape_name_the_folded_transform(shape):
    opt = optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(torch.full(shape, 0.1)))
    params = tree(0)
    with pytest.raises(ValueError, match=r"scale_by_learning_rate\(\.\.\.\)\.update: lr has shape"):
        opt.update(tree(1), opt.init(params), params)


def test_a_per_member_decay_of_the_wrong_shape_is_refused_in_the_fold():
    opt = optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(torch.ones(N + 1)),
                      optim.scale_by_learning_rate(0.1))  # fmt: skip
    params = tree(0)
    with pytest.raises(ValueError, match=r"add_decayed_weights\(\.\.\.\)\.update: weight_decay"):
        opt.update(tree(1), opt.init(params), params)


def test_a_folded_decay_needs_the_parameters():
    opt = optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(0.1),
                      optim.scale_by_learning_rate(0.1))  # fmt: skip
    with pytest.raises(ValueError, match="weight decay needs the parameters"):
        opt.update(tree(1), opt.init(tree(0)))


def test_a_replaced_follower_hyperparameter_is_checked_in_the_fold():
    decay = optim.add_decayed_weights(0.1)
    opt = optim.chain(optim.scale_by_adam(), decay, optim.scale_by_learning_rate(0.1))
    params = tree(0)
    state = opt.init(params)
    decay.hyperparameters["weight_decay"] = -1.0
    with pytest.raises(ValueError, match=r"add_decayed_weights.*weight_decay must be >= 0\.0"):
        opt.update(tree(1), state, params)


# ------------------------------------------------------------------ copies
@pytest.mark.parametrize(
    "build",
    [
        lambda: optim.chain(optim.clip_by_global_norm(1.0, per_member=True), optim.scale_by_adam(),
                            optim.add_decayed_weights(0.1), optim.scale_by_learning_rate(LRS)),
        lambda: optim.adamw(LRS),
        lambda: optim.sgd(0.1, momentum=0.9, nesterov=True),
        lambda: optim.rmsprop(LRS, momentum=0.5, centered=True),
    ],
)  # fmt: skip
@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_copies_of_optimizers_and_states_continue_as_the_original(build, copier):
    def clone(obj):
        return copy.deepcopy(obj) if copier == "deepcopy" else pickle.loads(pickle.dumps(obj))

    opt = build()
    params = tree(0)
    state = opt.init(params)
    updates, state = opt.update(tree(1), state, params)
    params = optim.apply_updates(params, updates)
    other, other_state = clone(opt), clone(state)
    ours, _ = opt.update(tree(2), state, params)
    theirs, _ = other.update(tree(2), other_state, params)
    for key in ("a", "b"):
        assert torch.equal(ours[key], theirs[key])


def test_rms_then_a_momentum_transform_gives_rmsprop_momentum():
    """RMSprop keeps its momentum inside scale_by_rms (one addcdiv); spelled as two
    transforms, the direction is made first and the momentum added after: the same bits."""
    momentum = torch.tensor([0.0, 0.5, 0.9], dtype=torch.float64)
    spelled, _ = run(optim.chain(optim.scale_by_rms(centered=True),
                                 optim.scale_by_momentum(momentum),
                                 optim.scale_by_learning_rate(LRS)))  # fmt: skip
    named, _ = run(optim.rmsprop(LRS, momentum=momentum, centered=True))
    for key in ("a", "b"):
        assert torch.equal(spelled[key], named[key])


def test_replacing_a_chains_transforms_folds_the_new_sequence():
    """Which neighbours fold is decided again with the sequence, never kept from the old one."""
    opt = optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(LRS))
    opt.transforms = (optim.scale_by_learning_rate(0.1), optim.scale_by_adam())
    ours, _ = run(opt)
    expected = one_at_a_time(opt.transforms)
    for key in ("a", "b"):
        assert torch.equal(ours[key], expected[key])
