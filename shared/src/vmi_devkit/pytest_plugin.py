"""Session-wide test setup for the whole monorepo.

Compiled kernels go to ``<repo>/.cache/vmi`` (gitignored) unless ``$VMI_CACHE_DIR``
names another cache, so test runs never write under ``~`` and later runs reuse
the binaries. Set here, at import time, so every pytest-xdist worker sees it
before the first kernel is compiled.

``--slow-share F --slow-seed S`` keeps a seeded share ``F`` of the slow sweeps:
CI runs a different share each time (it prints the seed), ``nox -s slow`` runs
them all, and any CI selection replays from its seed. The choice hashes each
test's node id with the seed, so every xdist worker selects the same tests.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

if not os.environ.get("VMI_CACHE_DIR"):
    os.environ["VMI_CACHE_DIR"] = str(Path(__file__).resolve().parent / ".cache" / "vmi")


def pytest_addoption(parser):
    group = parser.getgroup("vmi")
    group.addoption("--slow-share", type=float, default=1.0,
                    help="fraction of the slow tests to run, chosen by --slow-seed (default: all)")
    group.addoption("--slow-seed", type=int, default=0, help="seed of the --slow-share selection")


def _in_share(nodeid: str, seed: int, share: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def pytest_collection_modifyitems(config, items):
    share = config.getoption("--slow-share")
    if not 0.0 < share <= 1.0:
        raise pytest.UsageError(f"--slow-share must be in (0, 1], got {share}")
    if share == 1.0:
        return
    seed = config.getoption("--slow-seed")
    kept, dropped = [], []
    for item in items:
        keep = item.get_closest_marker("slow") is None or _in_share(item.nodeid, seed, share)
        (kept if keep else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config):
    share = config.getoption("--slow-share")
    if share < 1.0:
        seed = config.getoption("--slow-seed")
        return (f"slow sweeps: a share of {share:g}, seed {seed} "
                f"(replay: pytest -m slow --slow-share {share:g} --slow-seed {seed})")
    return None
