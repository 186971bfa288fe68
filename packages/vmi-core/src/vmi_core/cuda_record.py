"""What each op's cuda kernels did on a real GPU, and the gate that refuses the unverified ones.

Lowering and compiling with nvcc proves nothing about the bits a GPU computes, so the ``cuda``
target launches a kernel only if that exact kernel source has passed on a GPU: its SHA-256 is in
the record of the kernel's family with the result ``pass``. Anything else (never run, failed, or
changed since) raises ``UnverifiedKernelError`` before the launch, naming the kernel and how to
verify it. Setting ``VMI_CUDA_UNVERIFIED=1`` opts out (for running the check itself, or to try a
kernel at one's own risk).

Each family ships its record as ``cuda_record.json`` beside its package's ``__init__.py``:

* ``runs``: per run id, the GPU, date, commit and software of one ``scripts/gpu-check`` run;
* ``ops``: per op (the ``vmi`` command's name), the last run's outcome: its run id and a summary
  (cases passed of run, the first failure);
* ``kernels``: per source digest, the kernel, its specialisation, the ops whose cases launched it,
  the run and the result (``pass`` only if every case that launched it passed).

``scripts/gpu-check`` (``vmi_core.tools.devicecheck``) writes it; ``recording()`` tells the check
which kernels each case launched.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import json
import os
import threading
from collections.abc import Callable

OPT_IN_ENV = "VMI_CUDA_UNVERIFIED"
RECORD_FILE = "cuda_record.json"


class UnverifiedKernelError(RuntimeError):
    """A ``cuda`` kernel whose source has not passed on a GPU (see the module docstring)."""


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def family_package(build) -> str:
    """The top-level package of a kernel's builder (``vmi_quant.kernels.cast`` -> ``vmi_quant``)."""
    return build.__module__.partition(".")[0]


@functools.cache
def family_record(package: str) -> dict:
    """The record a family ships (an empty one if it ships none)."""
    try:
        text = importlib.resources.files(package).joinpath(RECORD_FILE).read_text()
    except (FileNotFoundError, ModuleNotFoundError):
        return {"runs": {}, "ops": {}, "kernels": {}}
    return json.loads(text)


def opted_in() -> bool:
    return os.environ.get(OPT_IN_ENV) == "1"


_recordings: list[list[dict]] = []
_recordings_lock = threading.Lock()
_passed: set[tuple] = set()


@contextlib.contextmanager
def recording():
    """Yields a list that collects, for every cuda kernel launched in this process while the block
    runs, ``{"package", "kernel", "spec", "digest"}`` (once per launch)."""
    launched: list[dict] = []
    with _recordings_lock:
        _recordings.append(launched)
    try:
        yield launched
    finally:
        with _recordings_lock:
            _recordings.remove(launched)


def _describe(build, spec) -> str:
    return f"{build.__module__}.{build.__qualname__} ({spec!r})"


def require_verified(build, spec, source: Callable[[], str]) -> None:
    """Refuse (``UnverifiedKernelError``) the cuda kernel ``build(spec)``, whose generated source
    ``source()`` gives, if that source has not passed on a GPU, unless ``VMI_CUDA_UNVERIFIED=1``;
    tell the active ``recording()`` blocks that it launches."""
    key = (build.__module__, build.__qualname__, spec)
    if not _recordings and (key in _passed or opted_in()):
        return
    package = family_package(build)
    digest = source_digest(source())
    if _recordings:
        launch = {"package": package, "kernel": f"{build.__module__}.{build.__qualname__}", "spec": repr(spec),
                  "digest": digest}
        with _recordings_lock:
            for launched in _recordings:
                launched.append(launch)
    if key in _passed or opted_in():
        return
    entry = family_record(package)["kernels"].get(digest)
    if entry is not None and entry["result"] == "pass":
        _passed.add(key)
        return
    if entry is None:
        why = "has not run on a GPU at its current source"
    else:
        run = family_record(package)["runs"].get(entry["run"], {})
        why = f"failed on {run.get('gpu', 'a GPU')} ({run.get('date', '?')}): {entry.get('detail', entry['result'])}"
    raise UnverifiedKernelError(
        f"cuda kernel {_describe(build, spec)} {why} (source sha256 {digest[:16]}). vmi launches only kernels "
        f"that passed on a GPU: run `bash scripts/gpu-check --ops OP` on a GPU host to check and record them "
        f"({package}/{RECORD_FILE}), or set {OPT_IN_ENV}=1 to run it unverified.")


def op_status(package: str, op: str) -> str:
    """The ``cuda`` support line of ``op`` for ``vmi list`` and the docs: what its last GPU run
    showed, and what the gate therefore launches."""
    record = family_record(package)
    opt_in = f"opt in: {OPT_IN_ENV}=1"
    outcome = record["ops"].get(op)
    if outcome is None:
        return f"lowers and compiles with nvcc (sm_90a); never run on a GPU, so launches are refused ({opt_in})"
    run = record["runs"].get(outcome["run"], {})
    where = ", ".join(str(run[k]) for k in ("gpu", "date", "commit") if run.get(k))
    ran = [k["result"] for k in record["kernels"].values() if k["run"] == outcome["run"] and op in k["ops"]]
    if not ran:
        gate = "its kernel sources were not recorded, so launches are refused"
    elif "pass" in ran:
        gate = "launches only the kernel sources that passed there"
    else:
        gate = "none of its kernel sources passed, so launches are refused"
    return f"last GPU run ({where}): {outcome['summary']}; {gate} ({opt_in})"
