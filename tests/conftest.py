"""Settings shared by every test module.

The suite runs on two pytest-xdist workers (pyproject.toml addopts: `-n 2 --dist loadgroup`), with
the scheduler below: each module's tests go to one worker together, so a module-scoped fixture is
built once, and the modules that launch multi-process torchrun jobs form one unit: their jobs run
one after another, never beside each other, so each gets the cores its step timeouts were set for.

xdist's own loadgroup reads `xdist_group` marks from a suffix it writes into `item._nodeid`, which
pytest 9 no longer reads (Node.nodeid is built from `_id`): under pytest 9 every test became a unit
of its own, and a module's tests were spread over both workers, each building the module's
fixtures (the torchrun batches and the brute-force searches twice).
"""

from __future__ import annotations

import pytest

TORCHRUN_MODULES = frozenset({"test_validate.py", "test_validate_parallel.py", "test_validate_grid.py"})
TORCHRUN = "torchrun"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """One unit per module, the torchrun modules one unit together, sent first: it is the
        longest (about a third of the suite's work), and a long unit started last would run on
        alone after the other worker finished."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return TORCHRUN if module.rsplit("/", 1)[-1] in TORCHRUN_MODULES else module

        def _assign_work_unit(self, node) -> None:
            if TORCHRUN in self.workqueue:
                self.workqueue.move_to_end(TORCHRUN, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)
