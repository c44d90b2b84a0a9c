"""The container core, the ground floor: every operation of a container, no feature.

Read from the ground up; each floor imports only the floors below it:

1. ``helpers/``: the functions and leaf types every mixin uses (batch sizes, nested
   keys, the leafwise engine, dims, leaf errors, devices, the write engine, the
   torch-function table, non-tensor leaves, ``ContainerMixin``, the base of the mixins).
2. One folder per concern, holding only its mixins: ``keys/`` (access and key views),
   ``state/`` (locks and context managers), ``shape/`` (batch dims and indexing),
   ``math/`` (leafwise math, ``apply``, autograd, torch functions), ``convert/``
   (constructors, casts, tables, consolidation). A mixin imports helpers, never
   another mixin.
3. Composition: ``tensor_like.py`` (``TensorLikeMixin``), ``ops.py`` (``TensorOps``,
   every core mixin put together), ``container.py`` (``TensorDictCore``) and
   ``base.py`` (``TensorDictBaseCore``, the abstract type).

The public classes are composed above this package (``tdfunc/_assembly.py``); a
mixin that needs "a plain TensorDict" asks ``self._plain_tensordict()``.

May import: ``tdfunc._core`` only (nothing of tdfunc above it).
"""
