"""What the kernel cache holds, and removing it: ``vmi cache info`` and ``vmi cache clear``.

The cache root (``compile.cache_dir``'s parent: ``$VMI_CACHE_DIR``, else ``$TILELANG_CACHE_DIR``,
else ``$XDG_CACHE_HOME/vmi``, else ``~/.cache/vmi``) holds one directory per cache key,
``vmi-<version>-<digest>`` (``compile.cache_key``): the current one, and those of earlier vmi
versions or toolchains, which nothing reads any more. Within a key directory,
an entry is one of TileLang's kernel directories (``<tilelang version>/<platform>/kernels/<hash>``:
cpu and cuda kernels), an ascend-sim library (``ascend-sim/*.so``) or an Ascend lowering
(``ascend-lowered/*.json``); the records in ``entries/`` say which op and target each belongs to.
``pch/`` and ``ascend-sim/pch/`` hold the precompiled headers the kernel builds share (``vmi_core.headers``).
Entries made before vmi kept records, or by kernels outside an op, have none: they are counted as
unrecorded. Only ``vmi-*`` directories are ever removed (the root may be TileLang's own cache).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..compile import ENTRIES_DIR, cache_dir
from ..targets import TARGETS


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def _entries(directory: Path) -> list[Path]:
    """The cache entries of one key directory (see the module docstring)."""
    return sorted([*directory.glob("*/*/kernels/*"), *directory.glob("ascend-sim/*.so"),
                   *directory.glob("ascend-lowered/*.json")])


def _records(directory: Path) -> dict[Path, dict]:
    """The records of one key directory whose files are all present: record file -> its contents."""
    found = {}
    for record in sorted((directory / ENTRIES_DIR).glob("*.json")):
        try:
            data = json.loads(record.read_text())
            paths = [directory / path for path in data["paths"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(path.exists() for path in paths):
            found[record] = data
    return found


@dataclass
class CacheInfo:
    """The cache root and key directory, sizes in bytes, and entry counts."""

    root: Path
    current: Path
    current_bytes: int = 0
    entries: int = 0
    stale: list[Path] = field(default_factory=list)
    stale_bytes: int = 0
    # (op, target) -> recorded kernel variants; op -> bytes of its files on all targets.
    recorded: dict[tuple[str, str], int] = field(default_factory=dict)
    op_bytes: dict[str, int] = field(default_factory=dict)
    unrecorded: int = 0
    unrecorded_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.current_bytes + self.stale_bytes


def info() -> CacheInfo:
    current = cache_dir()
    result = CacheInfo(current.parent, current)
    if current.is_dir():
        result.current_bytes = _size(current)
        entries = _entries(current)
        result.entries = len(entries)
        covered: set[Path] = set()
        op_paths: dict[str, set[Path]] = {}
        for data in _records(current).values():
            paths = {current / path for path in data["paths"]}
            covered |= paths
            op_paths.setdefault(data["op"], set()).update(paths)
            key = (data["op"], data["target"])
            result.recorded[key] = result.recorded.get(key, 0) + 1
        result.op_bytes = {op: sum(map(_size, paths)) for op, paths in op_paths.items()}
        rest = [entry for entry in entries if entry not in covered]
        result.unrecorded = len(rest)
        result.unrecorded_bytes = sum(_size(entry) for entry in rest)
    if current.parent.is_dir():
        result.stale = sorted(d for d in current.parent.glob("vmi-*") if d.is_dir() and d != current)
        result.stale_bytes = sum(_size(d) for d in result.stale)
    return result


def format_size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            break
    return f"{nbytes:.1f} {unit}"


def info_lines(result: CacheInfo) -> list[str]:
    """``vmi cache info``'s report."""
    lines = [f"cache root   {result.root}",
             f"current key  {result.current.name}: {format_size(result.current_bytes)}, {result.entries} entries "
             f"(TileLang kernel directories, ascend-sim libraries, Ascend lowerings)"]
    if result.stale:
        lines.append(f"other keys   {len(result.stale)} directories of other vmi versions or toolchains, "
                     f"{format_size(result.stale_bytes)} (unused; `vmi cache clear --stale` removes them)")
    lines.append(f"total        {format_size(result.total_bytes)}")
    if result.recorded:
        lines.append("kernel variants by op and target (size: the op's cache files, all targets):")
        ops = sorted({op for op, _ in result.recorded})
        targets = [t for t in TARGETS if any(target == t for _, target in result.recorded)]
        width = max(len("total"), *map(len, ops))
        lines.append(f"  {'op':<{width}}" + "".join(f"  {t:>10}" for t in targets) + f"  {'size':>10}")
        for op in ops:
            counts = [result.recorded.get((op, t), 0) for t in targets]
            lines.append(f"  {op:<{width}}" + "".join(f"  {c:>10}" for c in counts)
                         + f"  {format_size(result.op_bytes[op]):>10}")
        totals = [sum(n for (_, t), n in result.recorded.items() if t == target) for target in targets]
        lines.append(f"  {'total':<{width}}" + "".join(f"  {c:>10}" for c in totals))
    else:
        lines.append("no recorded kernel variants")
    if result.unrecorded:
        lines.append(f"unrecorded entries: {result.unrecorded} ({format_size(result.unrecorded_bytes)}): made before "
                     f"vmi recorded ops, or kernels compiled outside an op")
    return lines


@dataclass(frozen=True)
class ClearPlan:
    """What ``clear`` removes: whole key directories, or entries (with their records) of the current one."""

    directories: tuple[Path, ...] = ()
    paths: tuple[Path, ...] = ()
    records: tuple[Path, ...] = ()
    kept_unrecorded: int = 0

    @property
    def nbytes(self) -> int:
        return sum(_size(path) for path in (*self.directories, *self.paths))

    @property
    def empty(self) -> bool:
        return not (self.directories or self.paths or self.records)


def plan_clear(ops: tuple[str, ...] = (), targets: tuple[str, ...] = (), stale_only: bool = False) -> ClearPlan:
    """Without filters: every ``vmi-*`` key directory under the root; ``stale_only``: all but the
    current one; with ``ops`` and/or ``targets``: the recorded entries of those ops on those targets
    in the current key directory (files another remaining record uses stay)."""
    current = cache_dir()
    if not (ops or targets):
        if not current.parent.is_dir():
            return ClearPlan()
        keys = sorted(d for d in current.parent.glob("vmi-*") if d.is_dir() and not (stale_only and d == current))
        return ClearPlan(directories=tuple(keys))
    records = _records(current) if current.is_dir() else {}
    chosen = {record: data for record, data in records.items()
              if (not ops or data["op"] in ops) and (not targets or data["target"] in targets)}
    kept = {current / path for record, data in records.items() if record not in chosen for path in data["paths"]}
    paths = sorted({current / path for data in chosen.values() for path in data["paths"]} - kept)
    covered = {current / path for data in records.values() for path in data["paths"]}
    unrecorded = sum(entry not in covered for entry in _entries(current)) if current.is_dir() else 0
    return ClearPlan(paths=tuple(paths), records=tuple(sorted(chosen)), kept_unrecorded=unrecorded)


def clear(plan: ClearPlan) -> None:
    for path in (*plan.directories, *plan.paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for record in plan.records:
        record.unlink(missing_ok=True)
