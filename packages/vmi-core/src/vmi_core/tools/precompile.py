"""``vmi precompile``: compile the kernels a server will call, before it serves.

A variant is an op with a full set of options, a target and a flavor. By default the variants are
every op's default options, in both flavors on ``cpu`` and in the target's own flavor elsewhere;
``--from-config`` reads them from a model's configuration (``load_config``).

What a variant warms, per target:

- ``cpu``, ``ascend-sim``: the op runs once on ``PRECOMPILE_ROWS`` tokens of its shape (the
  default shape, or the config's). That is the path of a real call, so the cache entry is exactly
  the one a user's first call loads: the shared library TileLang builds (cpu), the Ascend lowering
  and the simulator's library (ascend-sim). Kernels are specialised on everything but the token
  count (MoE kernels on the expert count), never on the token count itself.
- ``cuda``: with a GPU, the op runs as above; without one, the kernel the op's options select is
  compiled directly (TileLang lowers it and builds it with nvcc, which needs no GPU) into the same
  cache entry, so a cache made on a build host serves a GPU host with the same toolchain. Without a
  GPU only the op's default shape can be compiled (its ``source`` names the kernel variant).
- ``ascend``: with an NPU, the op runs as above; with the CANN compiler (``bisheng``) but no NPU,
  the kernel is compiled directly as for cuda. Without either, only the lowering to AscendC (seconds
  of CPU per kernel) is done and cached: ``vmi source`` and ascend-sim use it, but the NPU build
  does not (TileLang's Ascend compile lowers again), so such variants are reported as lowered.

Variants run in worker processes (TileLang compiles hold the GIL), ``jobs`` at a time.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from ..targets import FLAVORS, device_of, resolve_flavor
from .registry import OpInfo, discover

# Tokens of the call that warms a variant on cpu and ascend-sim: a multiple of every op's row
# block (per-block casts need multiples of 128), small enough to run in milliseconds.
PRECOMPILE_ROWS = 128
CONFIG_KEYS = ("op", "options", "shape", "flavor")


@dataclass(frozen=True)
class Variant:
    """One op call to warm: ``options`` holds every option, ``shape`` the shape of a real call."""

    op: str
    options: tuple[tuple[str, object], ...]
    target: str
    flavor: str
    shape: tuple[int, ...]

    def label(self, op: OpInfo) -> str:
        """The options that differ from the op's defaults, as ``name=value``, or ``defaults``."""
        changed = [f"{name}={value}" for (name, value), option in zip(self.options, op.options, strict=True)
                   if value != option.default]
        extra = [] if self.shape[1:] == op.default_shape[1:] else [f"shape={'x'.join(map(str, self.shape))}"]
        return ", ".join(changed + extra) or "defaults"


@dataclass(frozen=True)
class Result:
    """``status``: ``compiled`` (at least one kernel built), ``lowered`` (Ascend lowering only),
    ``cached`` (everything loaded from the cache), ``shared`` (the kernels of another variant in
    the list, e.g. a flavor-independent kernel's other flavor) or ``failed`` (``detail`` says why)."""

    variant: Variant
    status: str
    seconds: float
    kernels: int = 0
    detail: str = ""


def flavors_of(target: str) -> tuple[str, ...]:
    return FLAVORS if target == "cpu" else (resolve_flavor(target).name,)


def _check_options(op: OpInfo, options: object, where: str) -> dict:
    if not isinstance(options, dict):
        raise ValueError(f"{where}: options must be an object of name: value, got {type(options).__name__}")
    pairs = []
    for name, value in options.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, str)):
            text = str(value)
        else:
            raise ValueError(f"{where}: option {name} must be a number, string or true/false, got {value!r}")
        option = next((o for o in op.options if o.name == name.replace("-", "_")), None)
        if option is not None and isinstance(option.default, bool) != isinstance(value, bool):
            wanted = "true or false" if isinstance(option.default, bool) else f"a value like {option.default!r}"
            raise ValueError(f"{where}: option {name} takes {wanted}, got {value!r}")
        pairs.append(f"{name}={text}")
    try:
        return op.parse_options(pairs)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def load_config(path: Path, ops: dict[str, OpInfo]) -> list[tuple[OpInfo, dict, tuple[int, ...], str | None]]:
    """The op calls of a model configuration: a JSON list of objects

        {"op": NAME, "options": {NAME: VALUE, ...}, "shape": [TOKENS, HIDDEN], "flavor": "ascend"|"cuda"}

    where only ``op`` is required (options default to the op's, the shape to its default shape:
    give it where the kernel depends on more than the token count, e.g. a MoE gate's expert count;
    the flavor to both on cpu). Each entry is checked as ``vmi run -o`` checks options; a mistake is
    a ValueError naming the file and entry.
    """
    try:
        entries = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON: {error}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: the configuration must be a JSON list of {{\"op\": ..., \"options\": {{...}}}} "
                         f"entries, got a {type(entries).__name__}")
    calls = []
    for index, entry in enumerate(entries):
        where = f"{path}: entry {index}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object with an \"op\", got {entry!r}")
        unknown = sorted(set(entry) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(CONFIG_KEYS)}")
        name = entry.get("op")
        if name not in ops:
            raise ValueError(f"{where}: unknown op {name!r}; installed ops: {', '.join(sorted(ops)) or 'none'}")
        op = ops[name]
        where = f"{where} ({op.name})"
        options = _check_options(op, entry.get("options", {}), where)
        shape = entry.get("shape", list(op.default_shape))
        if (not isinstance(shape, list) or len(shape) != len(op.default_shape)
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)):
            raise ValueError(f"{where}: shape must be a list of {len(op.default_shape)} positive integers like "
                             f"{list(op.default_shape)}, got {shape!r}")
        flavor = entry.get("flavor")
        if flavor is not None and flavor not in FLAVORS:
            raise ValueError(f"{where}: flavor must be one of {FLAVORS}, got {flavor!r}")
        calls.append((op, options, tuple(shape), flavor))
    return calls


def variants(calls, targets: tuple[str, ...]) -> list[Variant]:
    """The variants of ``(op, options, shape, flavor)`` calls on ``targets``, without repeats; a call's
    flavor applies where the target has it (cpu), the target's own flavor elsewhere."""
    found: dict[Variant, None] = {}
    for op, options, shape, flavor in calls:
        for target in targets:
            if target not in op.targets:
                continue
            own = flavors_of(target)
            for name in (flavor,) if flavor in own else own:
                found[Variant(op.name, tuple(options.items()), target, name, shape)] = None
    return list(found)


def default_calls(ops: list[OpInfo]):
    return [(op, op.parse_options([]), op.default_shape, None) for op in ops]


def _device_present(target: str) -> bool:
    import torch

    device = device_of(target)
    if device == "cuda":
        return torch.cuda.is_available()
    if device == "npu":
        return hasattr(torch, "npu") and torch.npu.is_available()
    return True


def _can_build_ascend() -> bool:
    from tilelang.contrib.bisheng import find_bisheng_path

    try:
        find_bisheng_path()
    except RuntimeError:
        return False
    return True


def _warm(op: OpInfo, variant: Variant, options: dict) -> bool:
    """Compile (or lower) ``variant``'s kernels; False when only the Ascend lowering could be done."""
    from ..compile import cached_kernel, kernel_requests, kernel_source

    if _device_present(variant.target):
        shape = (PRECOMPILE_ROWS, *variant.shape[1:])
        op.run(op.make_inputs(shape, options, 0), options, variant.target, variant.flavor)
        return True
    if variant.shape[1:] != op.default_shape[1:]:
        raise ValueError(f"without its device, {variant.target} kernels are compiled for the op's default shape "
                         f"{'x'.join(map(str, op.default_shape))} only; run vmi precompile on the "
                         f"{variant.target} host for shape {'x'.join(map(str, variant.shape))}")
    build = variant.target == "cuda" or _can_build_ascend()
    with kernel_requests() as requests:
        op.source(options, variant.target, variant.flavor)
    if not requests:
        raise ValueError(f"{op.name} names no kernel for {variant.target}")
    for builder, spec, target, config in requests:
        if build:
            cached_kernel(builder, spec, target, **config)
        else:
            kernel_source(builder, spec, target, **config)
    return build


def _init_worker() -> None:
    """One torch thread per worker; the ops imported once (their import also quiets TileLang's
    compile log: ``vmi_core.compile.configure_tilelang_logging``)."""
    import torch

    torch.set_num_threads(1)
    discover()


def run_variant(variant: Variant) -> Result:
    """Warm one variant in this process (a worker's task)."""
    from ..compile import watch_entries

    op = discover()[variant.op]
    start = time.perf_counter()
    try:
        with watch_entries() as seen:
            built = _warm(op, variant, dict(variant.options))
    except Exception as error:  # noqa: BLE001  (reported in the summary; the command exits 1)
        line = (str(error).strip().splitlines() or [""])[0]
        return Result(variant, "failed", time.perf_counter() - start, detail=f"{type(error).__name__}: {line}")
    seconds = time.perf_counter() - start
    fresh = any(entry.fresh for entry in seen)
    status = "cached" if not fresh else "compiled" if built else "lowered"
    detail = "" if built else "AscendC lowering only: no NPU and no CANN compiler on this host"
    return Result(variant, status, seconds, len(seen), detail)


def _kernels_of(op: OpInfo, variant: Variant) -> tuple:
    """What decides ``variant``'s kernels: the builders and specialisations its options select (as
    the op's ``source`` names them), its target and the shape past the token count."""
    from ..compile import kernel_requests

    try:
        with kernel_requests() as requests:
            op.source(dict(variant.options), variant.target, variant.flavor)
    except Exception:  # noqa: BLE001  (the variant then runs alone, and its worker reports the error)
        return (variant,)
    named = tuple((f"{build.__module__}.{build.__qualname__}", repr(spec), target, repr(sorted(config.items())))
                  for build, spec, target, config in requests)
    return (named or variant, variant.target, variant.shape[1:])


def precompile(todo: list[Variant], jobs: int, progress: bool | None = None) -> list[Result]:
    """Warm ``todo`` in ``jobs`` worker processes; the results in ``todo``'s order. A variant whose
    kernels another one in ``todo`` builds is not run again (``shared``). ``progress``: show a
    progress bar on stderr (None: when stderr is a terminal)."""
    from tqdm import tqdm

    ops = discover()
    results: dict[Variant, Result] = {}
    first: dict[tuple, Variant] = {}
    for variant in todo:
        same = first.setdefault(_kernels_of(ops[variant.op], variant), variant)
        if same is not variant:
            results[variant] = Result(variant, "shared", 0.0, detail=f"the kernels of the {same.flavor} flavor")
    todo_run = [variant for variant in todo if variant not in results]
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's threads
    disable = None if progress is None else not progress
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo_run))), mp_context=context,
                             initializer=_init_worker) as pool, \
            tqdm(total=len(todo_run), unit="variant", desc="precompile", disable=disable, leave=False) as bar:
        futures = {pool.submit(run_variant, variant): variant for variant in todo_run}
        for future in as_completed(futures):
            try:
                result = future.result()
            except BrokenProcessPool as error:  # a worker died (e.g. a crash in a compiler): no result
                result = Result(futures[future], "failed", 0.0, detail=f"worker process died: {error}")
            results[result.variant] = result
            bar.set_postfix_str(f"{result.variant.op} {result.variant.target} {result.status}", refresh=False)
            bar.update()
    return [results[variant] for variant in todo]


def summary_lines(results: list[Result], ops: dict[str, OpInfo], wall: float) -> list[str]:
    if not results:
        return ["nothing to precompile"]
    labels = [r.variant.label(ops[r.variant.op]) for r in results]
    op_w = max(len("op"), *(len(r.variant.op) for r in results))
    opt_w = max(len("options"), *map(len, labels))
    lines = [f"  {'op':<{op_w}}  {'target':<10}  {'flavor':<6}  {'options':<{opt_w}}  {'result':<8}  {'time':>8}"]
    for result, label in zip(results, labels, strict=True):
        v = result.variant
        line = (f"  {v.op:<{op_w}}  {v.target:<10}  {v.flavor:<6}  {label:<{opt_w}}  {result.status:<8}  "
                f"{result.seconds:>6.2f} s")
        lines.append(line + (f"  {result.detail}" if result.detail else ""))
    count = {status: sum(r.status == status for r in results)
             for status in ("compiled", "lowered", "cached", "shared", "failed")}
    lines.append(f"{len(results)} variants: {count['compiled']} compiled, {count['lowered']} lowered only, "
                 f"{count['cached']} cache hits, {count['shared']} sharing another's kernels, "
                 f"{count['failed']} failed; "
                 f"{sum(r.seconds for r in results):.1f} s of work in {wall:.1f} s")
    return lines
