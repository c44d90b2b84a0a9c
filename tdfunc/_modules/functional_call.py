"""``functional_call``: call a module with other parameters, given as a TensorDict or dicts.

``torch.func.functional_call`` takes only dicts of dotted names. This one
takes what tdfunc users hold: a TensorDict (nested by submodule, or with
dotted keys, or both), a TensorClass, a dict (flat or nested) or a tuple of
them, and runs the call inside the same compiled swap as
``with params.to_module(module):``, so it costs what ``to_module`` costs and
works under ``vmap``, ``grad``, ``jacrev`` and ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .._core.helpers.mixin import is_tensor_collection as _collection
from .module_swap import CallSwap, swap_mapping


def _mapping(params: Any) -> Any:
    """The mapping a swap plan reads: a container's ``_data`` or a dict."""
    if _collection(params):
        return params._data
    if type(params) is dict:
        return params
    if isinstance(params, (tuple, list)):
        merged: dict = {}
        for position, part in enumerate(params):
            if not (_collection(part) or isinstance(part, Mapping)):
                raise TypeError(
                    f"functional_call: expected every element of the parameter tuple to be a "
                    f"TensorDict, a TensorClass or a dict; element {position} is a "
                    f"{type(part).__name__}."
                )
            items = part._data if _collection(part) else part
            repeated = [key for key in items if key in merged]
            if repeated:
                raise ValueError(
                    f"functional_call: the keys {repeated} appear in more than one of the "
                    f"given mappings; which value to use would be ambiguous. Pass each key once."
                )
            merged.update(items)
        return merged
    if isinstance(params, Mapping):
        return dict(params)
    raise TypeError(
        f"functional_call: expected the parameters as a TensorDict, a TensorClass, a dict of "
        f"tensors or a tuple of those, got {type(params).__name__}."
    )


def functional_call(
    module: nn.Module,
    params: Any,
    args: Any = None,
    kwargs: dict | None = None,
    *,
    strict: bool = False,
    tie_weights: bool = True,
) -> Any:
    """Call ``module(*args, **kwargs)`` with ``params`` in place of its parameters and buffers.

    The module's own tensors fill whatever ``params`` leaves out, and come back
    unchanged after the call (also when it raises). Keys are those of
    ``TensorDict.from_module`` (nested by submodule) or of ``named_parameters``
    (dotted); a key the module does not have is a ``KeyError`` naming the
    closest names.

    Args:
        module: the module to call.
        params: a TensorDict, a TensorClass, a dict (flat with dotted keys, or
            nested) or a tuple of those with distinct keys.
        args: the positional arguments; a value that is not a tuple is the
            only argument. ``None``: no argument.
        kwargs: the keyword arguments.
        strict: require a value for every parameter and buffer of the module
            (``RuntimeError`` naming the missing ones otherwise).
        tie_weights: one value for tied parameters (``model.b.weight =
            model.a.weight``): a key for either fills both, and two keys for one
            tie must hold the same tensor. ``False``: each key fills only its
            own name.

    Returns:
        What ``module`` returns.

    Example:
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> params = TensorDict.from_module(model).apply(torch.zeros_like)
        >>> functional_call(model, params, torch.ones(2, 3))
        tensor([[0.],
                [0.]])
        >>> stacked = torch.stack([params, params.apply(torch.ones_like)])
        >>> torch.func.vmap(functional_call, (None, 0, None))(model, stacked, torch.ones(3))
        tensor([[ 0.],
                [17.]])
    """
    handle = swap_mapping(_mapping(params), module, CallSwap, "functional_call", tie_weights)
    if strict:
        missing = handle._plan.missing_names()
        if missing:
            handle.restore()
            raise RuntimeError(
                f"functional_call: strict=True but no value was given for "
                f"{', '.join(map(repr, missing))} of {type(module).__name__}. Give every "
                f"parameter and buffer (TensorDict.from_module(module) lists them), or "
                f"strict=False to keep the module's own for the rest."
            )
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with handle:
        return module(*args, **(kwargs or {}))
