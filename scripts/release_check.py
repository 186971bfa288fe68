"""Release checks of one vmi package, the same in the release workflow and in ``nox -s release``.

    python scripts/release_check.py vmi-moe                        # what a vmi-moe release would ship
    python scripts/release_check.py --tag vmi-quant-v0.1.0         # the workflow: the package from the tag
    python scripts/release_check.py vmi-core --tag vmi-core-v0.1.0 --torch-index https://download.pytorch.org/whl/cpu

For the package (``vmi-core``, ``vmi-quant``, ``vmi-mhc`` or ``vmi-moe``):

1. the tag, if given, is ``<package>-v<version>`` with the package's version (its module's
   ``__version__``, which hatch reads for the metadata), and the package's CHANGELOG.md has an entry
   for that version, dated when a tag is given;
2. a family package's ``vmi-core`` requirement admits the in-tree vmi-core's version (a family that
   needs a newer vmi-core than its pin allows fails here: release vmi-core first, then raise the pin),
   and that vmi-core version is on the package index (``--core-index``, default PyPI), where the
   family's users will get it from, unless vmi-core is released in the same run (``--with-core``);
3. its wheel and sdist are built into ``OUT/publish`` (only they, and with ``--with-core`` vmi-core's,
   built and checked the same way: the workflow uploads that folder), carry the LICENSE (the wheel
   also the module's ``py.typed``) and pass ``twine check --strict``;
4. a fresh venv gets torch (the pinned version, a CPU build where ``--torch-index`` names one), then
   the wheel alone with, for a family, vmi-core from the index (or the one built in this run) and
   tilelang from the index, at the versions of ``shared/constraints.txt``; no other vmi
   distribution may come along;
5. there, the package's smoke check runs: the module says the version being released, ``vmi run OP``
   against the reference, and ``vmi bench OP`` at one small shape, which must say that no baseline is
   installed (the baselines are in the repository's vmi-devkit, not in a wheel); vmi-core, alone, is
   imported and ``vmi list`` runs.

The build uses the running Python's ``build``, ``hatchling`` and ``twine`` (no build isolation);
exit status 1 with one ``release check:`` line on a failed check.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the tomli backport
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "shared" / "constraints.txt"
PACKAGES = ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe")
# The op each family's installed wheel runs; None: no op yet, an import check.
SMOKE_OPS = {"vmi-core": None, "vmi-quant": "per_token_cast", "vmi-mhc": "mhc_reduce_partials_and_rmsnorm_fwd",
             "vmi-moe": "moe_topk_gate"}
BENCH_SHAPE = "256x512"
CORE_INDEX = "https://pypi.org/simple"
TAG = re.compile(r"^(?P<package>vmi-[a-z]+)-v(?P<version>\d+\.\d+\.\d+)$")


class CheckFailed(Exception):
    """A release check that did not pass: one line saying which and why."""


def say(message: str) -> None:
    print(f"release check: {message}", flush=True)


def run(*command, capture: bool = False) -> str:
    shown = " ".join(str(part) for part in command)
    print(f"+ {shown}", flush=True)
    result = subprocess.run([str(part) for part in command], text=True, capture_output=capture)
    if result.returncode != 0:
        if capture:
            print(result.stdout + result.stderr, flush=True)
        raise CheckFailed(f"`{shown}` exited with status {result.returncode}")
    return result.stdout if capture else ""


def project(package: str) -> dict:
    with open(ROOT / "packages" / package / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def version_of(package: str) -> str:
    """The package's version: its module's ``__version__`` (the one place it is written; hatch reads
    it there for the metadata)."""
    init = (ROOT / "packages" / package / "src" / package.replace("-", "_") / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', init, flags=re.M)
    if match is None:
        raise CheckFailed(f"packages/{package}: no __version__ = \"X.Y.Z\" line in the module's __init__.py")
    return match[1]


def package_of_tag(tag: str) -> tuple[str, str]:
    match = TAG.match(tag)
    if not match or match["package"] not in PACKAGES:
        raise CheckFailed(f"tag {tag!r} is not <package>-vX.Y.Z with a package of {', '.join(PACKAGES)}")
    return match["package"], match["version"]


def check_version(package: str, tag: str | None) -> str:
    """The package's version; with a tag, the tag must name this package at this version."""
    version = version_of(package)
    if tag is not None:
        tagged, tag_version = package_of_tag(tag)
        if tagged != package:
            raise CheckFailed(f"tag {tag} is for {tagged}, not {package}")
        if tag_version != version:
            raise CheckFailed(f"tag {tag} says {tag_version}, {package}'s __version__ says {version}")
    check_changelog((ROOT / "packages" / package / "CHANGELOG.md").read_text(), package, version,
                    released=tag is not None)
    say(f"{package} {version}" + (f" matches tag {tag}" if tag else "") + ", CHANGELOG entry present")
    return version


def check_changelog(changelog: str, package: str, version: str, released: bool) -> None:
    """The CHANGELOG has a ``## [version]`` heading; a release (a tag) needs it dated
    (``## [0.1.1] - 2026-12-04``), not marked unreleased."""
    heading = re.search(rf"^## \[{re.escape(version)}\](.*)$", changelog, flags=re.M)
    if heading is None:
        raise CheckFailed(f"packages/{package}/CHANGELOG.md has no '## [{version}]' entry")
    if released and not re.fullmatch(r" - \d{4}-\d{2}-\d{2}\s*", heading[1]):
        raise CheckFailed(f"packages/{package}/CHANGELOG.md: the '## [{version}]' heading must carry the release "
                          f"date ('## [{version}] - YYYY-MM-DD'), got {heading[0]!r}")


def check_core_pin(package: str) -> str | None:
    """A family's vmi-core requirement must admit the in-tree vmi-core; returns that version."""
    if package == "vmi-core":
        return None
    core = version_of("vmi-core")
    pins = [Requirement(r) for r in project(package).get("dependencies", [])]
    pins = [r for r in pins if r.name == "vmi-core"]
    if not pins:
        raise CheckFailed(f"{package} does not declare its vmi-core requirement")
    for pin in pins:
        if not pin.specifier.contains(Version(core), prereleases=True):
            raise CheckFailed(f"{package} requires {pin}, which the in-tree vmi-core {core} does not satisfy: "
                              f"release vmi-core first, or pin what {package} is tested against")
    say(f"{package}'s {', '.join(map(str, pins))} admits the in-tree vmi-core {core}")
    return core


def check_core_published(core: str, index: str) -> None:
    """vmi-core ``core`` must be downloadable from ``index`` (pip's own configuration ignored)."""
    with tempfile.TemporaryDirectory() as scratch:
        found = subprocess.run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "download",
                                "--quiet", "--no-deps", "--index-url", index, "--dest", scratch, f"vmi-core=={core}"],
                               capture_output=True, text=True)
    if found.returncode != 0:
        raise CheckFailed(f"vmi-core {core} (the in-tree version this release is tested with) is not on {index}: "
                          f"release vmi-core {core} first, or with this package in one run (--with-core)")
    say(f"vmi-core {core} is on {index}")


def build(package: str, out: Path, sdist: bool = True) -> list[Path]:
    """The package's wheel (and sdist) in ``out``, built from the working tree without isolation."""
    out.mkdir(parents=True, exist_ok=True)
    kinds = ["--wheel", "--sdist"] if sdist else ["--wheel"]
    before = set(out.iterdir())
    run(sys.executable, "-m", "build", "--no-isolation", *kinds, "--outdir", out, ROOT / "packages" / package)
    built = sorted(set(out.iterdir()) - before)
    if len(built) != len(kinds):
        raise CheckFailed(f"building {package} gave {[p.name for p in built]}")
    check_contents(package, built)
    return built


def check_contents(package: str, files: list[Path]) -> None:
    """The wheel carries the licence (``dist-info/licenses/LICENSE``, declared in its metadata) and
    the module's ``py.typed``; the sdist carries the licence as a file."""
    module = package.replace("-", "_")
    licence = (ROOT / "LICENSE").read_bytes()
    for path in files:
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                names = wheel.namelist()
                licences = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
                metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
                if not licences or wheel.read(licences[0]) != licence:
                    raise CheckFailed(f"{path.name} does not carry the LICENSE")
                if "License-File: LICENSE" not in metadata.splitlines():
                    raise CheckFailed(f"{path.name} does not declare its LICENSE in METADATA")
                if f"{module}/py.typed" not in names:
                    raise CheckFailed(f"{path.name} has no {module}/py.typed")
        else:
            with tarfile.open(path) as sdist:
                member = next((m for m in sdist.getmembers() if m.name.endswith("/LICENSE") and m.name.count("/") == 1),
                              None)
                if member is None or not member.isfile() or sdist.extractfile(member).read() != licence:
                    raise CheckFailed(f"{path.name} does not carry the LICENSE as a file")


def twine_check(files: list[Path]) -> None:
    run(sys.executable, "-m", "twine", "check", "--strict", *files)


def fresh_venv(path: Path, torch_index: str | None) -> Path:
    """A new venv at ``path`` with the pinned torch; returns its python."""
    if path.exists():
        shutil.rmtree(path)
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    index = ["--index-url", torch_index] if torch_index else []
    # torch first, alone: vmi-core's torch>=2.10 would otherwise pull whatever build the index prefers.
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", CONSTRAINTS, *index, "torch")
    return python


def install_alone(python: Path, wheel: Path, core: str | None, core_source: list) -> None:
    """Install ``wheel`` with its dependencies (vmi-core ``core`` from where the pip options
    ``core_source`` point) and check that no other vmi distribution came along."""
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    extra = [*core_source, f"vmi-core=={core}"] if core else []
    run(*pip, "install", "--quiet", "-c", CONSTRAINTS, wheel, *extra)
    listed = run(*pip, "list", "--format=freeze", capture=True)
    found = sorted(line for line in listed.splitlines() if line.startswith("vmi-"))
    name = wheel.name.split("-")[0].replace("_", "-")
    expected = sorted({f"{name}=={wheel.name.split('-')[1]}", *([f"vmi-core=={core}"] if core else [])})
    if found != expected:
        raise CheckFailed(f"installing {wheel.name} alone gave {found}, expected {expected}")
    say(f"fresh venv has {', '.join(found)} and nothing else of vmi")


def smoke(python: Path, package: str) -> None:
    """Run the package's op (or import it) in the venv of ``python``; the installed module must say
    the version being released."""
    bindir = python.parent
    module = package.replace("-", "_")
    printed = run(python, "-c", f"import {module}; print({module}.__name__, {module}.__version__)", capture=True)
    expected = f"{module} {version_of(package)}"
    if printed.strip() != expected:
        raise CheckFailed(f"the installed {package} says {printed.strip()!r}, expected {expected!r}")
    op = SMOKE_OPS[package]
    if op is None:
        run(bindir / "vmi", "list")
        return
    run(bindir / "vmi", "run", op)
    out = run(bindir / "vmi", "bench", op, "--shape", BENCH_SHAPE, "--repeat", "1", "--threads", "1", capture=True)
    print(out, end="")
    if "baseline: none installed" not in out:
        raise CheckFailed(f"vmi bench {op} from the wheel does not say that no baseline is installed")


def check_installed_wheel(wheel: Path, core: str | None, core_source: list, package: str, venv_dir: Path,
                          torch_index: str | None = None) -> None:
    """Fresh venv, the wheel alone (plus vmi-core ``core`` from ``core_source``), the package's smoke check."""
    python = fresh_venv(venv_dir, torch_index)
    install_alone(python, wheel, core, core_source)
    smoke(python, package)


def release_check(package: str, tag: str | None, out: Path, venv_dir: Path, torch_index: str | None,
                  core_index: str = CORE_INDEX, with_core: bool = False) -> list[Path]:
    """All checks of one package's release (with ``with_core``, of vmi-core's too); returns the files
    to publish, vmi-core's first."""
    check_version(package, tag)
    core = check_core_pin(package)
    if core is not None and not with_core:
        check_core_published(core, core_index)
    if out.exists():
        shutil.rmtree(out)
    publish = []
    if core is not None and with_core:
        check_changelog((ROOT / "packages" / "vmi-core" / "CHANGELOG.md").read_text(), "vmi-core", core,
                        released=tag is not None)
        publish = build("vmi-core", out / "publish")
    publish += build(package, out / "publish")
    twine_check(publish)
    core_source = ["--find-links", out / "publish"] if with_core else ["--extra-index-url", core_index]
    wheel = next(p for p in publish if p.suffix == ".whl" and p.name.startswith(package.replace("-", "_")))
    check_installed_wheel(wheel, core, core_source, package, venv_dir, torch_index)
    say(f"{package} passed; to publish: {', '.join(p.name for p in publish)} in {out / 'publish'}")
    return publish


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", choices=PACKAGES, help="default: the tag's package")
    parser.add_argument("--tag", help="the release tag, <package>-vX.Y.Z: its version must be the package's")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "release",
                        help="OUT/publish gets the package's wheel and sdist (default dist/release)")
    parser.add_argument("--venv", type=Path, default=ROOT / ".nox" / "release-check",
                        help="where the fresh venv goes (replaced)")
    parser.add_argument("--torch-index", help="index URL of torch for the fresh venv (e.g. PyTorch's CPU index)")
    parser.add_argument("--core-index", default=CORE_INDEX,
                        help=f"the index a family's vmi-core must be on (default {CORE_INDEX})")
    parser.add_argument("--with-core", action="store_true",
                        help="a family released together with the in-tree vmi-core: check and publish both")
    args = parser.parse_args(argv)
    try:
        package = args.package or (package_of_tag(args.tag)[0] if args.tag else None)
        if package is None:
            parser.error("name a package or give --tag")
        release_check(package, args.tag, args.out, args.venv, args.torch_index, args.core_index,
                      args.with_core)
    except CheckFailed as error:
        say(f"FAILED: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
