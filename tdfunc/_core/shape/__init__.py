"""Shape and indexing: the mixins that act on the batch dims of a container.

- ``batch.py``: ``BatchMixin`` (``batch_size``, ``shape``, ``names``, ``len``, iteration);
- ``item.py``: ``ItemMixin`` (``td[index]`` and ``td[index] = value``);
- ``shape_ops.py``: ``ShapeOpsMixin`` (``reshape``, ``permute``, ``unbind``, ...);
- ``index_ops.py``: ``IndexOpsMixin`` (gather, where, masks, flips, tiles);
- ``ragged.py``: ``RaggedMixin`` (nested tensors along a batch dim);
- ``combine.py``: ``CombineMixin``, and ``tdfunc.cat``, ``stack``, ``merge_tensordicts``.

May import: ``tdfunc._core.helpers`` only.
"""
