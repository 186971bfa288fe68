"""Nox sessions for the vmi monorepo.

Run them with the nox installed by ``bash scripts/setup``::

    .venv/bin/nox -l            # list sessions
    .venv/bin/nox -s quant      # one family's tests
    .venv/bin/nox -s tests -- -k per_token_cast   # arguments after -- go to pytest

Every session runs in the current environment (``venv_backend="none"``): the
``.venv`` that scripts/setup made, with torch, the five packages and vmi-devkit
(shared/) installed in editable mode. No session creates its own environment or
reinstalls torch, except ``build`` and ``release``, which check wheels in fresh
venvs under ``.nox/`` (scripts/release_check.py, at the versions of
shared/constraints.txt), and ``docs``, whose tools live in their own venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PACKAGES = ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe", "vmi")
TEST_DIRS = {
    "core": "packages/vmi-core/tests",
    "quant": "packages/vmi-quant/tests",
    "mhc": "packages/vmi-mhc/tests",
    "moe": "packages/vmi-moe/tests",
}
INTEGRATION_DIR = "tests-integration"
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
def integration(session: nox.Session) -> None:
    """Cross-package tests (not slow), plus the DeepSeek-V4-style block and its expert-parallel training
    step on 2 and 4 ranks under torchrun (marker ``block``: slow for the default run, which they would
    take past its budget; about 2 minutes)."""
    _pytest(session, "-m", "not slow or block", INTEGRATION_DIR)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """All tests except the slow sweeps."""
    _pytest(session, "-m", "not slow")


@nox.session(venv_backend="none")
def npu(session: nox.Session) -> None:
    """On an Ascend 950 host: calibrate ascend-sim, test every family on the ascend target, check and
    benchmark every op (``scripts/npu-check``; arguments after ``--`` go to it, e.g.
    ``-- --target ascend-sim`` to run it on the CPU)."""
    session.run("bash", str(ROOT / "scripts" / "npu-check"), *session.posargs, external=True,
                env={"PYTHON": sys.executable})


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """Only the slow sweeps (pytest's exit 5, no slow test collected, counts as success)."""
    _pytest(session, "-m", "slow", success_codes=(0, 5))


@nox.session(venv_backend="none")
def exhaustive(session: nox.Session) -> None:
    """Every binary32 input through the correctly rounded functions' cpu kernels (minutes each)."""
    _pytest(session, "-m", "exhaustive", "-s", "packages/vmi-core/tests")


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.run(sys.executable, "-m", "ruff", "check", ".", *session.posargs)


@nox.session(venv_backend="venv", reuse_venv=True)
def docs(session: nox.Session) -> None:
    """The API reference site, built in its own venv (.nox/docs: torch, the five packages in editable mode
    and docs/requirements.txt, kept between runs): mkdocs build --strict into site/ (arguments after --
    go to mkdocs build)."""
    pins = ("-c", str(ROOT / "shared" / "constraints.txt"))
    session.install(*pins, "torch", "hatchling", "editables")
    session.install(*pins, "--no-build-isolation", *(f"-e{ROOT / 'packages' / p}" for p in PACKAGES),
                    "-r", str(ROOT / "docs" / "requirements.txt"))
    session.run("mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})


def _release_check():
    """scripts/release_check.py as a module: the checks the release workflow runs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import release_check

    return release_check


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Build the five wheels into dist/; install each family package alone with vmi-core from them and run an
    op, then the meta-package ``vmi`` and run its demo (arguments after -- name the packages to check)."""
    rc = _release_check()
    dist = ROOT / "dist"
    for old in dist.glob("vmi*.whl"):
        old.unlink()
    checked = session.posargs or [p for p, smoke in rc.SMOKE_OPS.items() if smoke]
    try:
        for package in PACKAGES:
            rc.build(package, dist, sdist=False)
        for package in checked:
            wheel = next(dist.glob(f"{rc.module_of(package)}-*.whl"))
            rc.check_installed_wheel(wheel, package, rc.check_vmi_pins(package), ["--find-links", dist],
                                     ROOT / ".nox" / "wheel-check")
    except rc.CheckFailed as error:
        session.error(str(error))


@nox.session(venv_backend="none")
def release(session: nox.Session) -> None:
    """The release workflow's checks of one package, without publishing (-- vmi-moe [--with-deps] [--tag ...])."""
    if not session.posargs:
        session.error("name the package: nox -s release -- vmi-moe [--with-deps] [--tag vmi-moe-v0.1.0]")
    session.run(sys.executable, str(ROOT / "scripts" / "release_check.py"), *session.posargs)
