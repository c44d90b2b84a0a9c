"""Leafwise math: the mixins that map one function over every tensor leaf.

- ``apply.py``: ``ApplyMixin`` (``apply`` and the leaf-wise methods built on it);
- ``pointwise.py``, ``arith.py``: element-wise math, arithmetic operators, comparisons;
- ``reductions.py``: reductions over elements and batch dims;
- ``autograd.py``: ``backward``, ``grad``, ``requires_grad_``;
- ``torch_function.py``: ``TorchFunctionMixin`` (``torch.stack``, ``torch.cat``, ...).

The engine (``leafwise.py``) and the ``__torch_function__`` table are helpers.

May import: ``tdfunc._core.helpers`` only.
"""
