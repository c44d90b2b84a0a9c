"""Memory-mapped persistence: one directory per container, one file per tensor leaf.

- ``api.py``: ``PersistMixin`` (``memmap``, ``memmap_like``, ``load_memmap``, ...);
- ``save.py`` / ``load.py``: writing and reading a checkpoint (commit by rename);
- ``directory.py``: the directory a save owns (never touching files it did not write);
- ``format.py``: ``meta.json`` (versioned, bounded, validated); ``filenames.py``: key -> file name;
- ``memmap_tensor.py``: ``MemoryMappedTensor``; ``files.py``: its files (fresh names, size
  checks, ``write()``); ``to_process.py``: sending files, not values, to other processes;
- ``schema.py``: ``from_schema`` (preallocation);
- ``nested.py``: nested tensors stored as their components; ``leaf.py``: a non-tensor leaf
  saved on its own; ``tensordict_read.py`` / ``tensordict_write.py``: tensordict's layout;
- ``confine.py``: the boundary of a checkpoint directory (no link followed, names inside);
- ``saved_paths.py``: which directory a container mirrors; ``write_back.py``,
  ``sharing.py``, ``make.py``: in-place writes reaching files, file identity, ``make_memmap``.

May import: ``tdfunc._core`` (classes are found by their stable names in
``_core/helpers/class_names.py``, never imported).
"""

from .api import PersistMixin as PersistMixin
from .api import memmap as memmap
from .memmap_tensor import MemoryMappedTensor as MemoryMappedTensor
