"""Lock and context state: the mixins that lock containers and undo calls on ``with`` exit.

- ``locking.py``: ``LockingMixin`` (``lock_``, ``unlock_`` over every level);
- ``context.py``: ``ContextMixin`` (``with td.unlock_():``, ``with td.flatten_keys():``).

May import: ``tdfunc._core.helpers`` only.
"""
