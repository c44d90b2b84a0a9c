"""The container core: ``TensorDict`` and the mixins every container shares.

``ops.py`` puts the shared mixins together (``TensorOps``); ``container.py`` adds
construction. Each mixin reads the state declared in ``mixin.py`` and nothing else.
"""
