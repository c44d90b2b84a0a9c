"""Conversion: new containers from containers and from other Python structures.

- ``constructors.py``: ``new_zeros``..., ``from_dict``, ``from_dataclass``, ``from_namedtuple``...;
- ``consolidate.py``: ``consolidate``, every tensor leaf as a view of one storage.

May import: ``tdfunc._core`` only.
"""
