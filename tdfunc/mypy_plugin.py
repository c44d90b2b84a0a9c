"""The mypy plugin for ``TensorClass["frozen", ...]`` bases.

Enable it in the mypy configuration::

    [tool.mypy]
    plugins = ["tdfunc.mypy_plugin"]
"""

from ._tensorclass.mypy import plugin as plugin
