"""Hypothesis runs the same examples on every run of the suite (CI included): a
property test that passes here passes there. Set ``TDFUNC_HYPOTHESIS=explore`` to
draw new examples each run (and keep failures in the local example database) while
hunting for bugs."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("suite", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile("explore" if os.environ.get("TDFUNC_HYPOTHESIS") == "explore" else "suite")
