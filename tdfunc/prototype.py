"""Compatibility location of the ``tensorclass`` decorator (``tensordict.prototype``).

Example:
    >>> from tdfunc.prototype import tensorclass
"""

from ._assembly import tensorclass as tensorclass
