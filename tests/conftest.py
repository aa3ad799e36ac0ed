"""Settings shared by every test module.

The suite runs on two pytest-xdist workers (pyproject.toml addopts: `-n 2 --dist loadgroup`). Each
module's tests stay together on one worker, so a module-scoped fixture is built once, and the
modules that launch multi-process torchrun jobs form one group: their jobs run one after another,
never beside each other, so each gets the cores its step timeouts were set for.
"""

from __future__ import annotations

import pytest

TORCHRUN_MODULES = frozenset({"test_validate.py", "test_validate_parallel.py", "test_validate_grid.py"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("torchrun" if name in TORCHRUN_MODULES else name))
