"""Optimizers for pytrees and stacked ensembles: functional and ``torch.optim``-style.

Functional (optax's contract; pure, differentiable, vmappable, compilable)::

    opt = tdfunc.optim.adam(lr=1e-3)
    state = opt.init(params)
    updates, state = opt.update(grads, state, params)
    params = tdfunc.optim.apply_updates(params, updates)

Stateful (``torch.optim.Optimizer`` subclasses): :class:`SGD`, :class:`Adam`,
:class:`AdamW`, :class:`RMSprop` for stacked parameters, with per-member hyperparameters.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> params = TensorDict({"w": torch.zeros(4, 3)}, batch_size=[4])
    >>> opt = adam(lr=torch.tensor([0.1, 0.2, 0.3, 0.4]))
    >>> state = opt.init(params)
    >>> grads = params.apply(torch.ones_like)
    >>> updates, state = opt.update(grads, state, params)
    >>> apply_updates(params, updates)["w"][:, 0]
    tensor([-0.1000, -0.2000, -0.3000, -0.4000])
"""

from ._chain import Chain as Chain
from ._chain import add_decayed_weights as add_decayed_weights
from ._chain import chain as chain
from ._chain import clip_by_global_norm as clip_by_global_norm
from ._chain import negate as negate
from ._chain import scale_by_adam as scale_by_adam
from ._chain import scale_by_learning_rate as scale_by_learning_rate
from ._chain import scale_by_momentum as scale_by_momentum
from ._chain import scale_by_rms as scale_by_rms
from ._groups import PerMember as PerMember
from ._named import adam as adam
from ._named import adamw as adamw
from ._named import rmsprop as rmsprop
from ._named import sgd as sgd
from ._schedulers import ReduceLROnPlateau as ReduceLROnPlateau
from ._stateful import SGD as SGD
from ._stateful import Adam as Adam
from ._stateful import AdamW as AdamW
from ._stateful import RMSprop as RMSprop
from ._transform import GradientTransformation as GradientTransformation
from ._transform import apply_updates as apply_updates

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Chain",
    "GradientTransformation",
    "PerMember",
    "RMSprop",
    "ReduceLROnPlateau",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip_by_global_norm",
    "negate",
    "rmsprop",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_momentum",
    "scale_by_rms",
    "sgd",
]
