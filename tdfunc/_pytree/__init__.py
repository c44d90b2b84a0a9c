"""Containers as native pytree nodes (``torch.utils._pytree`` and optree).

- ``node.py``: flatten and registration, the structure-only treespec context;
- ``rebuild.py``: unflatten, with the batch size inferred from the leaves
  (``infer.py`` has the rules);
- ``dims.py``: ``dims_like``, per-key ``in_dims`` / ``out_dims`` for ``vmap``.

``tdfunc/_assembly.py`` registers the composed classes, and every new tensorclass
through ``TensorClass._tc_register``.

May import: ``tdfunc._core`` only.
"""
