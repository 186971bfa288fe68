"""Release checks of one vmi package, the same in the release workflow and in ``nox -s release``.

    python scripts/release_check.py vmi-moe --with-deps            # what a vmi-moe release would ship
    python scripts/release_check.py --tag vmi-quant-v0.1.0         # the workflow: the package from the tag
    python scripts/release_check.py vmi-core --tag vmi-core-v0.1.0 --torch-index https://download.pytorch.org/whl/cpu

For the package (``vmi-core``, ``vmi-quant``, ``vmi-mhc``, ``vmi-moe`` or the meta-package ``vmi``):

1. the tag, if given, is ``<package>-v<version>`` with the package's version (its module's
   ``__version__``, which hatch reads for the metadata), and the package's CHANGELOG.md has an entry
   for that version, dated when a tag is given;
2. each requirement on another vmi package (a family's ``vmi-core``; the meta-package's four)
   admits that package's in-tree version (one that needs a newer vmi-core than its pin allows fails
   here: release vmi-core first, then raise the pin), and that version is on the package index
   (``--index``, default PyPI), where the users will get it from, unless those packages are released
   in the same run (``--with-deps``: they are checked and published too);
3. its wheel and sdist (with ``--with-deps``, theirs first) are built into ``OUT/publish`` (only they:
   the workflow uploads that folder), carry the LICENSE (the wheel also the module's ``py.typed``)
   and pass ``twine check --strict``;
4. a fresh venv gets torch (the pinned version, a CPU build where ``--torch-index`` names one), then
   the wheel alone with its vmi requirements from the index (or those built in this run) and
   tilelang from the index, at the versions of ``shared/constraints.txt``; no other vmi
   distribution may come along;
5. there, the package's smoke check runs: the module says the version being released; a family runs
   ``vmi run OP`` against the reference and ``vmi bench OP`` at one small shape, which must say that
   no baseline is installed (the baselines are in the repository's vmi-devkit, not in a wheel);
   vmi-core, alone, is imported and ``vmi list`` runs; the meta-package runs ``vmi demo``.

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
PACKAGES = ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe", "vmi")
# What each installed wheel runs: a family one op, vmi-core `vmi list`, the meta-package its demo.
DEMO = "demo"
SMOKE_OPS = {"vmi-core": None, "vmi-quant": "per_token_cast", "vmi-mhc": "mhc_reduce_partials_and_rmsnorm_fwd",
             "vmi-moe": "moe_topk_gate", "vmi": DEMO}
BENCH_SHAPE = "256x512"
INDEX = "https://pypi.org/simple"
TAG = re.compile(r"^(?P<package>vmi(?:-[a-z]+)?)-v(?P<version>\d+\.\d+\.\d+)$")


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


def module_of(package: str) -> str:
    return package.replace("-", "_")


def version_of(package: str) -> str:
    """The package's version: its module's ``__version__`` (the one place it is written; hatch reads
    it there for the metadata)."""
    init = (ROOT / "packages" / package / "src" / module_of(package) / "__init__.py").read_text()
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


def check_vmi_pins(package: str) -> dict[str, str]:
    """Each requirement of ``package`` on another vmi package must admit that package's in-tree
    version; returns them, ``{name: version}`` (a family: vmi-core; vmi-core: none)."""
    pins = [Requirement(r) for r in project(package).get("dependencies", [])]
    pins = [r for r in pins if r.name in PACKAGES]
    if package != "vmi-core" and not any(r.name == "vmi-core" for r in pins):
        raise CheckFailed(f"{package} does not declare its vmi-core requirement")
    in_tree = {}
    for pin in pins:
        version = in_tree[pin.name] = version_of(pin.name)
        if not pin.specifier.contains(Version(version), prereleases=True):
            raise CheckFailed(f"{package} requires {pin}, which the in-tree {pin.name} {version} does not satisfy: "
                              f"release {pin.name} first, or pin what {package} is tested against")
    if pins:
        say(f"{package}'s {', '.join(map(str, pins))} admit{'s' if len(pins) == 1 else ''} the in-tree "
            + ", ".join(f"{name} {version}" for name, version in in_tree.items()))
    return in_tree


def check_published(name: str, version: str, index: str) -> None:
    """``name==version`` must be downloadable from ``index`` (pip's own configuration ignored)."""
    with tempfile.TemporaryDirectory() as scratch:
        found = subprocess.run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "download",
                                "--quiet", "--no-deps", "--index-url", index, "--dest", scratch, f"{name}=={version}"],
                               capture_output=True, text=True)
    if found.returncode != 0:
        raise CheckFailed(f"{name} {version} (the in-tree version this release is tested with) is not on {index}: "
                          f"release {name} {version} first, or with this package in one run (--with-deps)")
    say(f"{name} {version} is on {index}")


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
    module = module_of(package)
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


def install_alone(python: Path, wheel: Path, package: str, deps: dict[str, str], deps_source: list) -> None:
    """Install ``wheel`` with its dependencies (the vmi packages ``deps`` from where the pip options
    ``deps_source`` point) and check that no other vmi distribution came along."""
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    pinned = [f"{name}=={version}" for name, version in deps.items()]
    run(*pip, "install", "--quiet", "-c", CONSTRAINTS, wheel, *(deps_source if deps else []), *pinned)
    listed = run(*pip, "list", "--format=freeze", capture=True)
    found = sorted(line for line in listed.splitlines() if line.split("==")[0] in PACKAGES)
    expected = sorted([f"{package}=={version_of(package)}", *pinned])
    if found != expected:
        raise CheckFailed(f"installing {wheel.name} alone gave {found}, expected {expected}")
    say(f"fresh venv has {', '.join(found)} and nothing else of vmi")


def smoke(python: Path, package: str) -> None:
    """Run the package's op (or import it) in the venv of ``python``; the installed module must say
    the version being released."""
    bindir = python.parent
    module = module_of(package)
    printed = run(python, "-c", f"import {module}; print({module}.__name__, {module}.__version__)", capture=True)
    expected = f"{module} {version_of(package)}"
    if printed.strip() != expected:
        raise CheckFailed(f"the installed {package} says {printed.strip()!r}, expected {expected!r}")
    op = SMOKE_OPS[package]
    if op is None:
        run(bindir / "vmi", "list")
        return
    if op == DEMO:
        out = run(bindir / "vmi", "demo", "--repeat", "1", capture=True)
        print(out, end="")
        if "block (forward + backward)" not in out:
            raise CheckFailed("vmi demo from the wheels did not print the block's stage table")
        return
    run(bindir / "vmi", "run", op)
    out = run(bindir / "vmi", "bench", op, "--shape", BENCH_SHAPE, "--min-time", "0.05", "--threads", "1",
              capture=True)
    print(out, end="")
    if "baseline: none installed" not in out:
        raise CheckFailed(f"vmi bench {op} from the wheel does not say that no baseline is installed")


def check_installed_wheel(wheel: Path, package: str, deps: dict[str, str], deps_source: list, venv_dir: Path,
                          torch_index: str | None = None) -> None:
    """Fresh venv, the wheel alone (plus its vmi requirements ``deps`` from ``deps_source``), the
    package's smoke check."""
    python = fresh_venv(venv_dir, torch_index)
    install_alone(python, wheel, package, deps, deps_source)
    smoke(python, package)


def release_check(package: str, tag: str | None, out: Path, venv_dir: Path, torch_index: str | None,
                  index: str = INDEX, with_deps: bool = False) -> list[Path]:
    """All checks of one package's release (with ``with_deps``, of its vmi requirements' too);
    returns the files to publish, the requirements' first."""
    check_version(package, tag)
    deps = check_vmi_pins(package)
    if not with_deps:
        for name, version in deps.items():
            check_published(name, version, index)
    if out.exists():
        shutil.rmtree(out)
    publish = []
    for name in (deps if with_deps else []):
        check_changelog((ROOT / "packages" / name / "CHANGELOG.md").read_text(), name, deps[name],
                        released=tag is not None)
        publish += build(name, out / "publish")
    publish += build(package, out / "publish")
    twine_check(publish)
    deps_source = ["--find-links", out / "publish"] if with_deps else ["--extra-index-url", index]
    wheel = next(p for p in publish if p.suffix == ".whl" and p.name.startswith(f"{module_of(package)}-"))
    check_installed_wheel(wheel, package, deps, deps_source, venv_dir, torch_index)
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
    parser.add_argument("--index", default=INDEX,
                        help=f"the index the package's vmi requirements must be on (default {INDEX})")
    parser.add_argument("--with-deps", action="store_true",
                        help="release the package's vmi requirements (their in-tree versions) in the same run")
    args = parser.parse_args(argv)
    try:
        package = args.package or (package_of_tag(args.tag)[0] if args.tag else None)
        if package is None:
            parser.error("name a package or give --tag")
        release_check(package, args.tag, args.out, args.venv, args.torch_index, args.index, args.with_deps)
    except CheckFailed as error:
        say(f"FAILED: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
