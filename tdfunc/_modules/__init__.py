"""Parameters in and out of ``nn.Module``: ``from_module(s)``, ``to_module``, ``functional_call``.

- ``module_swap.py``: ``ModuleSwapMixin`` (``from_module``, ``from_modules``, ``to_module``);
- ``swap_plan.py``: where each value goes in one module, built once per structure;
- ``swap_handle.py``: what ``to_module`` returns (the old values, a context manager);
- ``functional_call.py``: ``tdfunc.functional_call``.

May import: ``tdfunc._core``.
"""
