"""The functional layer: pytree nodes, module swapping, ``functional_call``, ensembles.

- ``pytree.py`` / ``rebuild.py``: registration with torch's pytree and optree, and the
  batch-size inference on unflatten; ``dims.py``: ``dims_like``;
- ``module_swap.py``, ``swap_plan.py``, ``swap_handle.py``: ``from_module(s)`` and
  ``to_module`` (compiled swap plans, the returned old values);
- ``functional_call.py``; ``ensemble.py`` and ``batched/``: ``Ensemble``.
"""
