"""vmi's pytest plugin: loaded by every pytest run of the development environment (vmi-devkit's
``pytest11`` entry point), whichever package's tests it collects.

Cache: compiled kernels go to ``<rootdir>/.cache/vmi`` (gitignored) unless ``$VMI_CACHE_DIR``
names another cache, so test runs never write under ``~`` and later runs reuse the binaries. Set
in ``pytest_configure``, before any test module is imported, in the controller and in every
pytest-xdist worker.

Targets: a test parametrized over ``target`` runs its kernel there (``None``: on the inputs'
device, the CPU in these tests; the pseudo-target ``torch``, the reference, runs anywhere and is
always kept). ``--target T`` (repeatable: ``--target cpu --target ascend-sim``) keeps the tests
on those targets and deselects the others; without it, the targets this machine runs are kept:
``cpu`` and ``ascend-sim`` always, ``cuda`` with a CUDA GPU, ``ascend`` with an NPU. A target asked
for that this machine cannot run is skipped, with the reason.

Slow share: ``--slow-share F --slow-seed S`` keeps a seeded share ``F`` of the slow sweeps: CI
runs a different share each time (it prints the seed), ``nox -s slow`` runs them all, and any CI
selection replays from its seed. The choice hashes each test's node id with the seed, so every
xdist worker selects the same tests. ``--slow-budget S`` bounds the wall time they may take: a slow
test that would start more than ``S`` seconds after the run began is skipped, saying so, so CI's
step ends inside its budget on a slow machine and reports what it left out.

Environment: vmi reads ``$VMI_TARGET``, ``$VMI_FLAVOR`` and ``$VMI_CPU_THREADS`` once
(``vmi_core.environment``), so a test changes them through the ``vmi_env`` fixture: its ``setenv``
and ``delenv`` are ``monkeypatch``'s followed by ``vmi_core.refresh_environment()``, and vmi reads
the restored environment after the test.
"""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from vmi_core import refresh_environment

MARKERS = (
    "slow: exhaustive sweeps, run in CI's separate bounded step",
    "exhaustive: every binary32 input through a kernel (minutes each): only under nox -s exhaustive "
    "(-m exhaustive), never in the default or slow runs",
    "cuda_compile: compiles generated CUDA source with nvcc",
    "block: the DeepSeek-V4-style block across the families and its expert-parallel variant (nox -s integration; "
    "also marked slow, out of the default run)",
    "properties: hypothesis property tests (default budget in the normal run; the slow twins run under "
    "nox -s slow, CI's share leaves them out)",
)

_DEADLINE = "VMI_SLOW_DEADLINE"  # --slow-budget's end, seconds since the epoch


def pytest_addoption(parser):
    group = parser.getgroup("vmi")
    group.addoption("--target", action="append", dest="vmi_targets", metavar="TARGET",
                    help="run the target-parametrized tests only on TARGET (repeatable; ascend, cuda, cpu, "
                         "ascend-sim); default: every target this machine runs")
    group.addoption("--slow-share", type=float, default=1.0,
                    help="fraction of the slow tests to run, chosen by --slow-seed (default: all)")
    group.addoption("--slow-seed", type=int, default=0, help="seed of the --slow-share selection")
    group.addoption("--slow-budget", type=float, default=None, metavar="SECONDS",
                    help="skip the slow tests that would start SECONDS after the run began (default: no bound)")


def runnable_targets() -> tuple[str, ...]:
    """The targets whose kernels run on this machine."""
    import torch

    found = ["cpu", "ascend-sim"]
    if torch.cuda.is_available():
        found.append("cuda")
    if hasattr(torch, "npu") and torch.npu.is_available():
        found.append("ascend")
    return tuple(found)


def pytest_configure(config):
    if not os.environ.get("VMI_CACHE_DIR"):
        os.environ["VMI_CACHE_DIR"] = str(config.rootpath / ".cache" / "vmi")
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    from vmi_core.targets import TARGETS

    asked = config.getoption("vmi_targets")
    unknown = sorted(set(asked or ()) - set(TARGETS))
    if unknown:
        raise pytest.UsageError(f"--target: unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    share = config.getoption("--slow-share")
    if not 0.0 < share <= 1.0:
        raise pytest.UsageError(f"--slow-share must be in (0, 1], got {share}")
    budget = config.getoption("--slow-budget")
    if budget is not None and not hasattr(config, "workerinput"):
        # Set in the controller before the xdist workers start: they inherit one deadline.
        os.environ[_DEADLINE] = repr(time.time() + budget)


class VmiEnvironment:
    """``monkeypatch.setenv`` and ``delenv``, each followed by ``vmi_core.refresh_environment()``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._monkeypatch = monkeypatch

    def setenv(self, name: str, value: str) -> None:
        self._monkeypatch.setenv(name, value)
        refresh_environment()

    def delenv(self, name: str, raising: bool = True) -> None:
        self._monkeypatch.delenv(name, raising=raising)
        refresh_environment()


@pytest.fixture
def vmi_env():
    """Changes vmi's environment variables for one test (see the module docstring)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield VmiEnvironment(monkeypatch)
    refresh_environment()


def pytest_runtest_setup(item):
    budget = item.config.getoption("--slow-budget")
    if budget is not None and item.get_closest_marker("slow") is not None \
            and time.time() > float(os.environ[_DEADLINE]):
        pytest.skip(f"the slow tests' budget of {budget:g} s is spent (--slow-budget)")


def _in_share(nodeid: str, seed: int, share: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def _target_of(item) -> str | None:
    """The target an item's kernel runs on, or None when it is not parametrized over one."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "target" not in params:
        return None
    target = params["target"]
    return "cpu" if target is None else target


def pytest_collection_modifyitems(config, items):
    runnable = runnable_targets()
    selected = tuple(config.getoption("vmi_targets") or runnable)
    share = config.getoption("--slow-share")
    seed = config.getoption("--slow-seed")
    kept, dropped = [], []
    exhaustive = "exhaustive" in (config.getoption("markexpr") or "")
    for item in items:
        target = _target_of(item)
        keep = target is None or target == "torch" or target in selected
        keep = keep and (exhaustive or item.get_closest_marker("exhaustive") is None)
        if keep and share < 1.0 and item.get_closest_marker("slow") is not None:
            keep = _in_share(item.nodeid, seed, share)
        if keep and target is not None and target != "torch" and target not in runnable:
            item.add_marker(pytest.mark.skip(reason=f"target {target!r} does not run on this machine "
                                                    f"(it runs {', '.join(runnable)})"))
        (kept if keep else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config):
    lines = []
    asked = config.getoption("vmi_targets")
    lines.append(f"vmi targets: {', '.join(asked) if asked else ', '.join(runnable_targets()) + ' (this machine)'}")
    share = config.getoption("--slow-share")
    if share < 1.0:
        seed = config.getoption("--slow-seed")
        lines.append(f"slow sweeps: a share of {share:g}, seed {seed} "
                     f"(replay: pytest -m slow --slow-share {share:g} --slow-seed {seed})")
    return lines
