"""Compatibility location of the ``tensorclass`` decorator (``tensordict.prototype``).

Example:
    >>> from tdfunc.prototype import tensorclass
"""

from ._tensorclass.tensorclass import tensorclass as tensorclass
