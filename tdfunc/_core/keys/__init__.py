"""Keys and access: reading and writing entries of a container.

- ``nested.py``: nested keys and their one normalisation function;
- ``access.py``: ``AccessMixin`` (``[]``, ``get``, ``set``, ``update``, ``del_``, ``keys``);
- ``writes.py``: the write engine (validation, conversion, atomic writes);
- ``update.py``: keyword forms of writes (``update(clone=, keys_to_update=, ...)``);
- ``fastpath.py``: the hot paths of get/set/``in``/pop for keys of any depth;
- ``locking.py``: ``LockingMixin`` (``lock_``, ``unlock_`` over every level);
- ``at_index.py``: ``AtIndexMixin`` (``get_at``, ``set_at_``, ``update_at_``, ``copy_at_``);
- ``views.py``: ``KeyViewsMixin`` (``select``, ``exclude``, ``flatten_keys``, ``to_dict``);
- ``state_dict.py``: ``state_dict`` / ``load_state_dict`` in ``nn.Module``'s convention.

May import: ``tdfunc._core`` only.
"""
