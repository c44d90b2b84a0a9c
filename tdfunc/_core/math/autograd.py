"""Autograd on containers: ``backward``, ``grad``, ``data``, ``requires_grad``, ``zero_grad``,
and ``torch.autograd.grad`` with containers as outputs and inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..helpers.leafwise import is_collection, leaf_items, map_leaves, tensor_leaves
from ..helpers.mixin import ContainerMixin
from ..helpers.rewrap import rewrap

_Tensor = torch.Tensor


class AutogradMixin(ContainerMixin):
    """Gradients of the leaves of a container.

    Example:
        >>> x = torch.ones(2, requires_grad=True)
        >>> td = TensorDict({"x": x}, [2])
        >>> (td * 3).sum(reduce=True).backward()
        >>> td.grad["x"].tolist(), td.requires_grad
        ([3.0, 3.0], True)
    """

    __slots__ = ()

    def backward(
        self,
        gradient: Any = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        """Backpropagate from every leaf that requires a gradient, in one autograd call.

        Without ``gradient`` each such leaf must have one element (its gradient is 1):
        ``td.backward()`` is ``td.sum(reduce=True).backward()`` for scalar leaves.
        ``gradient`` is a container matching those leaves by key.

        Example:
            >>> x = torch.ones(3, requires_grad=True)
            >>> TensorDict({"loss": (x * 2).sum(), "aux": x.sum()}, []).backward()
            >>> x.grad.tolist()
            [3.0, 3.0, 3.0]
        """
        items = [(k, t) for k, t in leaf_items(self) if t.requires_grad]
        if not items:
            raise RuntimeError(
                "TensorDict.backward: no leaf tensor requiring gradients; nothing to backpropagate."
            )
        grads = None
        if gradient is not None:
            given = dict(leaf_items(gradient._to_tensordict_view()))
            missing = [k for k, _ in items if k not in given]
            if missing:
                raise KeyError(
                    f"TensorDict.backward: Missing gradient entry for key "
                    f"{', '.join(repr(_shown(k)) for k in missing)}; gradient must have an entry "
                    f"for "
                    f"every leaf that requires a gradient, by key."
                )
            grads = [given[k] for k, _ in items]
        else:
            wide = [k for k, t in items if t.numel() != 1]
            if wide:
                raise RuntimeError(
                    f"TensorDict.backward: grad can be implicitly created only for scalar "
                    f"outputs: without gradient=, every leaf that requires a gradient must "
                    f"have one element; {wide} do not. Reduce first "
                    f"(td.sum(reduce=True).backward()) or pass gradient=<a TensorDict>."
                )
        if inputs is not None and is_collection(inputs):
            inputs = tensor_leaves(inputs._to_tensordict_view())
        torch.autograd.backward(
            [t for _, t in items],
            grads,
            retain_graph=retain_graph,
            create_graph=create_graph,
            inputs=inputs,
        )

    @property
    def grad(self):
        """A container of the ``.grad`` of each leaf (leaves without one are left out), or None.

        Example:
            >>> x = torch.ones(2, requires_grad=True)
            >>> (x * 2).sum().backward()
            >>> TensorDict({"x": x}, [2]).grad["x"].tolist()
            [2.0, 2.0]
        """
        if all(t.grad is None for t in tensor_leaves(self)):
            return None
        return _locked_like(self, _grads(self))

    @property
    def data(self):
        """A container of the ``.data`` of each leaf (same storage, no autograd history).

        Example:
            >>> x = torch.ones(2, requires_grad=True)
            >>> TensorDict({"x": x * 2}, [2]).data["x"].requires_grad
            False
        """
        return _locked_like(self, map_leaves(self, lambda t: t.data, None, True, None))

    @property
    def requires_grad(self) -> bool:
        """True when some tensor leaf requires a gradient.

        Example:
            >>> TensorDict({"x": torch.ones(2, requires_grad=True)}, [2]).requires_grad
            True
        """
        return any(t.requires_grad for t in tensor_leaves(self))

    def zero_grad(self, set_to_none: bool = True):
        """Clear the ``.grad`` of every leaf (``None``, or zeros with ``set_to_none=False``).

        Example:
            >>> x = torch.ones(2, requires_grad=True)
            >>> (x * 2).sum().backward()
            >>> _ = TensorDict({"x": x}, [2]).zero_grad()
            >>> x.grad is None
            True
        """
        for leaf in tensor_leaves(self):
            if leaf.grad is None:
                continue
            if set_to_none:
                leaf.grad = None
            else:
                leaf.grad.zero_()
        return self


def _locked_like(self: Any, out: Any) -> Any:
    """``out`` locked when ``self`` is (a view of a locked container stays read-only)."""
    return out.lock_() if self.is_locked else out


def _grads(self: Any) -> Any:
    data: dict[str, Any] = {}
    for key, value in self._data.items():
        if isinstance(value, _Tensor):
            if value.grad is not None:
                data[key] = value.grad
        elif is_collection(value):
            data[key] = rewrap(value, _grads(value._to_tensordict_view()))
    return self._like(data)


def _shown(key: Any) -> Any:
    """A key as users write it: ``"a"`` rather than ``("a",)``."""
    return key[0] if type(key) is tuple and len(key) == 1 else key
