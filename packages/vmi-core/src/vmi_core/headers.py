"""Precompiled headers for the kernel builds.

The headers every kernel of a target includes take most of a small kernel's build (TileLang's cpu
template with its ``half.hpp``: 0.4 of 0.5 s of g++), so GCC compiles them once per cache and each
kernel's build gets them with ``-include``. GCC reads ``H.gch`` in place of ``H`` only if the build's
flags agree with the ones it was made with, and ``H`` itself otherwise, which includes the same
headers: the code built is the same either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import subprocess
from pathlib import Path


@functools.cache
def is_gcc(cxx: str) -> bool:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Free Software Foundation" in version


@contextlib.contextmanager
def _locked(path: Path):
    """Held while one process builds a header: another that needs it waits, then uses it."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def precompiled_header(cxx: str, flags: tuple[str, ...], includes: tuple[str, ...], text: str,
                       directory: Path) -> tuple[str, ...]:
    """``("-include", H)``, with ``H`` holding ``text`` and ``H.gch`` its build by GCC with ``flags`` and
    ``includes`` (those of the builds that use it), made once in ``directory``; ``()`` where the
    compiler is not GCC or the header does not build. ``text`` must name (or carry) whatever decides
    the headers' contents, since it alone names ``H``."""
    if not is_gcc(cxx):
        return ()
    digest = hashlib.sha256(repr((cxx, flags, includes, text)).encode()).hexdigest()[:24]
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    header, built = directory / f"{digest}.h", directory / f"{digest}.h.gch"
    with _locked(directory / f"{digest}.lock"):
        if not (header.exists() and built.exists()):
            header.write_text(text)
            partial = directory / f"{digest}.{os.getpid()}.partial"
            result = subprocess.run([cxx, *flags, *(f"-I{path}" for path in includes), "-x", "c++-header",
                                     str(header), "-o", str(partial)], capture_output=True, text=True)
            if result.returncode != 0:
                partial.unlink(missing_ok=True)
                return ()
            os.replace(partial, built)
    return ("-include", str(header))
