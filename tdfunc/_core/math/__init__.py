"""Leafwise math: one function mapped over every tensor leaf.

- ``leafwise.py``: the engine (map over leaves, pairs of containers);
- ``pointwise.py``, ``arith.py``: element-wise math, arithmetic operators, comparisons;
- ``reductions.py``: reductions over elements and batch dims;
- ``dims.py``: the ``dim`` argument of reductions and batch-dim ops, checked as torch does;
- ``autograd.py``: ``backward``, ``grad``, ``requires_grad_``, ``torch.autograd.grad``;
- ``tensor_like.py``: ``TensorLikeMixin``, the tensor-like surface in one base class.

May import: ``tdfunc._core`` only.
"""
