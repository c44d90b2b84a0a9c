"""The ground floor of the core: what every mixin may use, and no mixin of a concern.

- ``sizes.py``, ``dims.py``, ``reshape.py``, ``pieces.py``, ``indexing.py``,
  ``padding.py``: batch sizes, the ``dim`` argument, shared shape rules, advanced
  indexing and padding;
- ``nested_keys.py``, ``fastpath.py``, ``writes.py``, ``update.py``,
  ``state_dict.py``: nested keys, the hot paths of key access, the write engine, the
  keyword forms of writes, ``state_dict`` in ``nn.Module``'s convention;
- ``leafwise.py``, ``rewrap.py``, ``leaf_errors.py``, ``autograd.py``,
  ``pointwise_names.py``, ``torch_functions.py``: one function mapped over every leaf,
  results in the caller's class, errors naming the leaf, ``torch.autograd.grad``, the
  ``__torch_function__`` table;
- ``mixin.py``: ``ContainerMixin``, the base of every mixin; ``frozen.py``,
  ``parents.py``, ``locks.py``: frozen, parent links and the lock rules;
- ``nontensor/``: the non-tensor leaves (``NonTensorData``, ``NonTensorStack``);
- ``class_names.py``, ``device.py``, ``options.py``, ``repr.py``, ``attrs.py``,
  ``build.py``: stable class names, devices, process-wide switches, printing, ``attrs``
  values, containers built from Python structures;
- ``hooks.py``: the public classes helpers build without importing them (bound by
  ``tdfunc/_assembly.py``); ``tracing.py``: whether a call is compiled, traced or
  transformed, for all of tdfunc; ``codegen.py``: the one code generator;
  ``legacy_paths.py``: module paths old pickles name.

May import: ``tdfunc._core.helpers`` only.
"""
