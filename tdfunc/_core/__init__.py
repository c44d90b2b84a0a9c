"""The container core, the ground floor: every operation of a container, no feature.

- ``container.py``: ``TensorDictCore`` (the state and construction of ``TensorDict``);
- ``base.py``: ``TensorDictBaseCore`` (the abstract type); ``mixin.py``: what mixins may use;
- ``ops.py``: ``TensorOps``, the core mixins put together;
- ``keys/``, ``shape/``, ``math/``, ``convert/``: keys and access, shapes and indexing,
  leafwise math, conversions; ``apply.py``, ``torch_function.py``, ``context.py``,
  ``casts.py``, ``frozen.py``, ``repr.py``, ``class_names.py``: one concern each;
  ``nontensor/``: the non-tensor leaves (``NonTensorData``, ``NonTensorStack``).

The public classes are composed above this package (``tdfunc/_assembly.py``); a
mixin that needs "a plain TensorDict" asks ``self._plain_tensordict()``.

May import: ``tdfunc._core`` only (nothing of tdfunc above it).
"""
