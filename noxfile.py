"""Nox sessions for the vmi monorepo.

Run them with the nox installed by ``bash scripts/setup``::

    .venv/bin/nox -l            # list sessions
    .venv/bin/nox -s quant      # one family's tests
    .venv/bin/nox -s tests -- -k per_token_cast   # arguments after -- go to pytest

Every session runs in the current environment (``venv_backend="none"``): the
``.venv`` that scripts/setup made, with torch and the four packages installed in
editable mode. No session creates its own environment or reinstalls torch,
except ``build``, which checks the wheels in a fresh venv under
``.nox/wheel-check``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PACKAGES = ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe")
TEST_DIRS = {
    "core": "packages/vmi-core/tests",
    "quant": "packages/vmi-quant/tests",
    "mhc": "packages/vmi-mhc/tests",
    "moe": "packages/vmi-moe/tests",
    "integration": "tests-integration",
}
TORCH_PIN = "torch==2.13.0"
WORKERS = "2"

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]


def _pytest(session: nox.Session, *args: str, success_codes: tuple[int, ...] = (0,)) -> None:
    session.run(sys.executable, "-m", "pytest", "-n", WORKERS, *args, *session.posargs,
                success_codes=list(success_codes))


def _family_session(name: str, test_dir: str) -> None:
    def run(session: nox.Session) -> None:
        _pytest(session, "-m", "not slow", test_dir)

    run.__doc__ = f"Tests of {test_dir} (not slow)."
    nox.session(name=name, venv_backend="none")(run)


for _name, _dir in TEST_DIRS.items():
    _family_session(_name, _dir)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """All tests except the slow sweeps."""
    _pytest(session, "-m", "not slow")


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """Only the slow sweeps (pytest's exit 5, no slow test collected, counts as success)."""
    _pytest(session, "-m", "slow", success_codes=(0, 5))


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.run(sys.executable, "-m", "ruff", "check", ".", *session.posargs)


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """The API reference site: docs/requirements.txt into the current environment, then mkdocs build --strict
    into site/ (arguments after -- go to mkdocs build)."""
    session.run(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "-r", str(ROOT / "docs" / "requirements.txt"))
    session.run(sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


# Each family package is installed alone from dist/ into a fresh venv and runs one op.
WHEEL_CHECKS = (("vmi-quant", "per_token_cast"), ("vmi-moe", "moe_topk_gate"))


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Build the four wheels into dist/; install each family package alone from them and run an op."""
    dist = ROOT / "dist"
    for old in dist.glob("vmi_*.whl"):
        old.unlink()
    dist.mkdir(exist_ok=True)
    for package in PACKAGES:
        # No build isolation: hatchling comes from the current environment, so no network is needed.
        session.run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(dist), str(ROOT / "packages" / package))
    for package, op in WHEEL_CHECKS:
        _check_wheel(session, dist, package, op)


def _check_wheel(session: nox.Session, dist: Path, package: str, op: str) -> None:
    venv = ROOT / ".nox" / "wheel-check"
    if venv.exists():
        shutil.rmtree(venv)
    session.run(sys.executable, "-m", "venv", str(venv))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # torch first, pinned, so vmi-core's torch>=2.10 does not pull a CUDA build.
    session.run(*pip, "install", TORCH_PIN)
    # vmi-core must come from dist/ (it is not on the index); tilelang comes from PyPI.
    session.run(*pip, "install", "--find-links", str(dist), package)
    listed = session.run(*pip[:-1], "list", "--format=freeze", silent=True) or ""
    vmi = sorted(line.split("==")[0] for line in listed.splitlines() if line.startswith("vmi-"))
    if vmi != sorted(["vmi-core", package]):
        session.error(f"installing {package} should pull only vmi-core, got {vmi}")
    shown = session.run(*pip[:-1], "show", "vmi-core", silent=True)
    if not shown or "Version: 0.1.0" not in shown:
        session.error(f"vmi-core 0.1.0 was not installed from {dist}:\n{shown}")
    session.run(str(venv / "bin" / "vmi"), "run", op)
