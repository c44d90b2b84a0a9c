"""Shape and indexing: what containers do to their batch dims.

- ``sizes.py``: batch-size arithmetic shared by every container;
- ``batch.py``: ``BatchMixin`` (``batch_size``, ``shape``, ``names``, ``len``, iteration);
- ``item.py``: ``ItemMixin`` (``td[index]`` and ``td[index] = value``);
- ``shape_ops.py``: ``ShapeOpsMixin`` (``reshape``, ``permute``, ``unbind``, ...);
- ``indexing.py``: advanced indexing, the index computed once for every leaf;
- ``index_ops.py``: gather, where, masks, flips, tiles;
- ``padding.py``: ``pad`` (the method and ``tdfunc.pad``) and ``pad_sequence``;
- ``combine.py``: ``tdfunc.cat``, ``stack``, ``merge_tensordicts``.

May import: ``tdfunc._core`` only.
"""
