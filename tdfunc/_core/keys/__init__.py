"""Keys and access: the mixins that read and write entries of a container.

- ``access.py``: ``AccessMixin`` (``[]``, ``get``, ``set``, ``update``, ``del_``, ``keys``);
- ``at_index.py``: ``AtIndexMixin`` (``get_at``, ``set_at_``, ``update_at_``, ``copy_at_``);
- ``views.py``: ``KeyViewsMixin`` (``select``, ``exclude``, ``flatten_keys``, ``to_dict``);
- ``nontensor.py``: ``NonTensorMixin`` (``set_non_tensor``, ``get_non_tensor``).

The write engine, nested keys and the fast paths are helpers (``tdfunc._core.helpers``).

May import: ``tdfunc._core.helpers`` only.
"""
