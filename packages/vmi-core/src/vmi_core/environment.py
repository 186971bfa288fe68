"""vmi's settings from the environment, read once.

``$VMI_TARGET`` (the default target), ``$VMI_FLAVOR`` (the default flavor of ``cpu`` and ``torch``;
see ``vmi_core.targets``) and ``$VMI_CPU_THREADS`` (the threads a ``cpu`` kernel call splits its
rows over, default all cores; see ``vmi_core.cpu_parallel``) are read by the first call that needs
them and kept: each read would cost a decode-size call about a microsecond. A process that changes
one of them afterwards calls ``refresh_environment()`` to have vmi read them again. Launch plans need
no ``plan.invalidate()`` for that: the values are part of every plan's signature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TARGET_ENV = "VMI_TARGET"
FLAVOR_ENV = "VMI_FLAVOR"
THREADS_ENV = "VMI_CPU_THREADS"
# Read once: os.cpu_count() reads sysfs on every call.
_CPU_COUNT = os.cpu_count() or 1


@dataclass(frozen=True)
class Environment:
    """The settings as read: ``target`` and ``flavor`` None where their variable is unset or empty."""

    target: str | None
    flavor: str | None
    cpu_threads: int


_current: Environment | None = None


def environment() -> Environment:
    """The settings as last read (read now if they never were)."""
    return _current or refresh_environment()


def refresh_environment() -> Environment:
    """Read ``$VMI_TARGET``, ``$VMI_FLAVOR`` and ``$VMI_CPU_THREADS`` again: call after changing one
    of them in a running process. Raises ``ValueError`` when ``$VMI_CPU_THREADS`` is not an integer."""
    global _current
    threads = os.environ.get(THREADS_ENV) or str(_CPU_COUNT)
    try:
        cpu_threads = max(1, int(threads))
    except ValueError:
        raise ValueError(f"${THREADS_ENV} must be an integer, got {threads!r}") from None
    _current = Environment(os.environ.get(TARGET_ENV) or None, os.environ.get(FLAVOR_ENV) or None, cpu_threads)
    return _current
