"""Parameters in and out of ``nn.Module``: ``from_module(s)``, ``to_module``, ``functional_call``.

- ``module_swap.py``: ``ModuleSwapMixin`` (``from_module``, ``from_modules``, ``to_module``)
  and the per-module cache of swap plans;
- ``swap_plan.py``: where each value goes in one module, built once per structure;
- ``swap_fast.py``: how a built plan runs fast (generated code, reads by column);
- ``swap_handle.py``: ``SwapHandle``, what ``to_module`` returns (the old values, a context
  manager); the public ``ModuleSwap`` is composed in ``tdfunc/_assembly.py``;
- ``slots.py``: ``iter_slots``, the one walk over a module's parameter and buffer slots;
- ``functional_call.py``: ``tdfunc.functional_call``.

May import: ``tdfunc._core`` only (the handle class comes from the container's
``_swap_handle`` hook).
"""
