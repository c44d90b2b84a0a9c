"""Conversion: the mixins that make new containers, from containers and from Python data.

- ``constructors.py``: ``new_zeros``..., ``from_dict``, ``from_dataclass``, ``from_namedtuple``...;
- ``interop.py``, ``tabular.py``: NumPy structured arrays, pytrees, tables;
- ``entries.py``: ``tolist``, ``from_list``, ``popitem``...;
- ``casts.py``: ``to``, ``cuda``, ``float``...; ``attrs.py``: ``attrs``;
- ``consolidate.py``: ``consolidate``, every tensor leaf as a view of one storage.

May import: ``tdfunc._core.helpers`` only.
"""
