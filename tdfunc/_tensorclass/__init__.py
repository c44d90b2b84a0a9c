"""``TensorClass``: what a typed container adds to the shared methods of ``TensorDict``.

- ``tensorclass.py``: ``TensorClassCore`` (flags, field collection at subclass time, the
  generated ``__init__``) and the work of the ``@tensorclass`` decorator;
- ``state.py``: state forwarded to the inner TensorDict, casting on write, frozen refusal;
- ``fields.py``: field collection and casting rules; ``convert.py``: conversions, repr;
- ``mypy.py``: the mypy plugin behind ``tdfunc.mypy_plugin``.

The public ``TensorClass`` and ``tensorclass`` are composed in ``tdfunc/_assembly.py``;
the plain TensorDict class and the pytree registration reach this package through
hooks of the composed class (``_plain_tensordict()``, ``_tc_register``).

May import: ``tdfunc._core`` only.
"""
