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

import os

import pytest

# torch ops in the test processes on one thread each (before any test module imports torch): with
# torch's default of one thread per core, the two workers' OpenMP threads outnumber the two cores and
# every parallel region waits for a thread the other worker holds. test_hybrid's tiny model (hidden
# 32) beside a running suite: 1.85 s a training step with 2 threads, 0.03 s with 1. Subprocesses
# inherit it (torchrun's ranks set their own, planner.validate.worker: threads_per_rank). A value
# the caller sets wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TORCHRUN_MODULES = frozenset({"test_validate.py", "test_validate_parallel.py", "test_validate_grid.py"})
TORCHRUN = "torchrun"
# The units that take longest, sent first in this order (longest first: a long unit sent last runs on
# alone after the other worker has finished), then the others in xdist's order (most tests first).
# Seconds per module summed from `--durations=0` of a whole-suite run on two workers, 2026-11-27:
# torchrun 277, test_search 175, test_properties_plan 132, test_docs_examples 82, test_accuracy 57,
# test_launch_deepspeed_run 55, test_launch 52, test_bad_inputs 50, test_launch_titan_model 47,
# test_nanotron_sweep 39, test_launch_megatron_model 39, test_launch_parsers 38, test_params 34,
# test_launch_roundtrip 33, test_sweep 27; every other module under 21.
SLOWEST_FIRST = (TORCHRUN, "test_search.py", "test_properties_plan.py", "test_docs_examples.py", "test_accuracy.py",
                 "test_launch_deepspeed_run.py", "test_launch.py", "test_bad_inputs.py", "test_launch_titan_model.py",
                 "test_nanotron_sweep.py", "test_launch_megatron_model.py", "test_launch_parsers.py", "test_params.py",
                 "test_launch_roundtrip.py", "test_sweep.py")


def _order(scope: str) -> int:
    name = scope.rsplit("/", 1)[-1]
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # the two hooks below are LoadScopeScheduling's own (xdist 3.x); an xdist without them gets its
    # default scheduler rather than an error
    if not all(hasattr(LoadScopeScheduling, n) for n in ("_split_scope", "_assign_work_unit")):
        return None

    class ModuleScheduling(LoadScopeScheduling):
        """One unit per module, the torchrun modules one unit together; SLOWEST_FIRST's units first."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return TORCHRUN if module.rsplit("/", 1)[-1] in TORCHRUN_MODULES else module

        def _assign_work_unit(self, node) -> None:
            # min keeps the queue's order among equals
            queue = getattr(self, "workqueue", None)
            if queue and hasattr(queue, "move_to_end"):
                queue.move_to_end(min(queue, key=_order), last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)
