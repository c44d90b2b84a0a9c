"""``TensorClass``: what a typed container adds to the shared methods of ``TensorDict``.

- ``tensorclass.py``: the class, flags, ``@tensorclass``, the generated ``__init__``;
- ``state.py``: state forwarded to the inner TensorDict, casting on write, frozen refusal;
- ``fields.py``: field collection and casting rules; ``convert.py``: conversions, repr;
- ``mypy.py``: the mypy plugin behind ``tdfunc.mypy_plugin``.
"""
