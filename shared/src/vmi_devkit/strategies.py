"""Hypothesis profiles and building blocks shared by the packages' property tests.

Imported only by test modules; ``hypothesis`` is a dependency of vmi-devkit, not of any wheel.

Profiles (registered and loaded by ``load_profile()``, which every property-test module calls):

* ``default``: ``DEFAULT_EXAMPLES`` examples per property test, no deadline (the first call of a
  kernel compiles it), ``print_blob=True`` so a failure prints ``@reproduce_failure(...)``;
* ``slow``: ``SLOW_EXAMPLES`` examples per test; chosen with ``VMI_HYPOTHESIS_PROFILE=slow``.

Each property exists twice in the test modules: a default-budget test in the normal run (a small,
fixed set of option combinations, so few kernels compile) and a ``@pytest.mark.slow`` twin with
``settings(max_examples=SLOW_EXAMPLES)`` over every option combination, so ``pytest -m slow`` runs at
least ``SLOW_EXAMPLES`` cases per op whatever profile is loaded. A default-budget test whose
examples are costly takes ``few_settings()``: a share of the profile's examples.

Every value an op's ``Command`` options document (each choice, both values of a flag) must be drawn
by its slow twins: each property module states per op what they draw (``DRAWN``, derived from the
case tables with ``drawn_values``) and checks it with ``assert_every_option_value_drawn``.

Replaying a failure: paste the printed ``@reproduce_failure("<version>", b"<blob>")`` decorator on
the failing test, or rerun with the seed the report prints (``pytest --hypothesis-seed=<seed>``);
examples are also kept in ``.hypothesis/`` and retried first on the next run.

Tensors are not drawn element by element (too slow for thousands of elements): a drawn seed feeds
vmi_core.tools.testing's generators, and special values are then written at drawn positions, so the
whole input is a function of the drawn choices and shrinks with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from vmi_core.formats import f32_from_bits
from vmi_core.library import KERNEL_OPS
from vmi_core.tools.testing import generator, randn_with_ties, with_zero_groups

PROFILE_ENV = "VMI_HYPOTHESIS_PROFILE"
DEFAULT_EXAMPLES = 20
SLOW_EXAMPLES = 1000
SENTINEL = 0xA5

_COMMON = dict(deadline=None, print_blob=True, derandomize=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
settings.register_profile("default", max_examples=DEFAULT_EXAMPLES, **_COMMON)
settings.register_profile("slow", max_examples=SLOW_EXAMPLES, **_COMMON)


def load_profile() -> str:
    """Load the profile named by ``VMI_HYPOTHESIS_PROFILE`` (``default`` when unset); returns its name."""
    name = os.environ.get(PROFILE_ENV, "default")
    settings.load_profile(name)
    return name


def slow_settings(**kwargs):
    """``settings`` of a ``@pytest.mark.slow`` twin: at least ``SLOW_EXAMPLES`` examples."""
    return settings(max_examples=max(SLOW_EXAMPLES, settings.default.max_examples), **kwargs)


def few_settings(share: int = 4, **kwargs):
    """``settings`` of a default-budget test whose examples are costly (large references): a ``share``-th
    of the loaded profile's examples (5 of the default profile's 20, 250 of the slow profile's)."""
    return settings(max_examples=max(1, settings.default.max_examples // share), **kwargs)


# --- shapes ------------------------------------------------------------------------------------------------------

TOKEN_EDGES = [0, 1, 2, 31, 32, 33, 63, 64, 65, 97]


def token_counts(limit: int = 140) -> st.SearchStrategy[int]:
    """0 and 1 token, both sides of 32-token work tiles, anything up to ``limit``."""
    return st.one_of(st.sampled_from(TOKEN_EDGES), st.integers(0, limit))


def hidden_sizes(unit: int = 64, most: int = 448) -> st.SearchStrategy[int]:
    """Multiples of ``unit`` up to ``most`` (partial 128-column tiles when ``unit`` is 64)."""
    return st.integers(1, most // unit).map(lambda n: n * unit)


# --- special values ---------------------------------------------------------------------------------------------

F32_MAX = 3.4028234663852886e38
BF16_MAX = 3.3895313892515355e38
# fp32 bit patterns: NaNs (quiet, signalling, negative, payload), infinities, signed zeros, fp32
# subnormals, the largest finite fp32 and bf16, E4M3 saturation 448 and its midpoint 464, E4M3
# subnormal steps and ties, E2M1 ties (2.5, 5.0 after scaling), bf16 ties.
NONFINITE_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA12345, 0x7F800000, 0xFF800000]
FINITE_SPECIAL_BITS = [
    0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00400000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F0000, 0xFF7F0000,
    0x43E00000, 0xC3E80000, 0x43E80000, 0x43E7FFFF, 0x3B000000, 0x3A800000, 0xBAC00000, 0x3AA00000,
    0x40200000, 0xC0A00000, 0x3F400000, 0x3FE00000, 0x3F808000, 0x3F818000, 0xBF80C000, 0x00800000,
]


def special_values(nonfinite: bool) -> st.SearchStrategy[int]:
    """fp32 bit patterns to mix into data; the non-finite ones only when ``nonfinite``."""
    return st.sampled_from(FINITE_SPECIAL_BITS + (NONFINITE_BITS if nonfinite else []))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


def float_matrix(data, rows: int, cols: int, dtype: torch.dtype, *, nonfinite: bool = False, group: int = 32,
                 max_specials: int = 12) -> torch.Tensor:
    """A contiguous ``(rows, cols)`` ``dtype`` matrix: normal samples over many binades with E4M3/E2M1
    rounding ties, zero groups (signed), and up to ``max_specials`` drawn special values at drawn places."""
    seed = data.draw(seeds(), label="seed")
    x = randn_with_ties((rows, cols), seed)
    if x.numel():
        g = generator(seed + 7)
        x = x * torch.exp2(torch.randint(-20, 20, (rows, 1), generator=g).float())
        x = with_zero_groups(x, group, seed)
        n = data.draw(st.integers(0, max_specials), label="num specials")
        if n:
            where = data.draw(st.lists(st.integers(0, x.numel() - 1), min_size=n, max_size=n), label="positions")
            what = data.draw(st.lists(special_values(nonfinite), min_size=n, max_size=n), label="specials")
            flat = x.view(-1)
            flat[torch.tensor(where)] = f32_from_bits(torch.tensor(what, dtype=torch.int64))
    return x.to(dtype)


def with_row_padding(data, x: torch.Tensor, pads=(0, 0, 1, 7, 64)) -> torch.Tensor:
    """``x`` (2-D) or an equal copy whose rows lie in a wider buffer (row stride > columns)."""
    pad = data.draw(st.sampled_from(pads), label="row padding")
    if not pad or x.dim() != 2:
        return x
    wide = torch.full((x.shape[0], x.shape[1] + pad), float("nan")).to(x.dtype)
    wide[:, :x.shape[1]] = x
    return wide[:, :x.shape[1]]


def plain_input(data, rows: int, cols: int, dtype: torch.dtype, group: int) -> torch.Tensor:
    """A drawn ``float_matrix`` (non-finite values drawn or not) in drawn row padding."""
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    x = float_matrix(data, rows, cols, dtype, nonfinite=nonfinite, group=group)
    return with_row_padding(data, x)


# --- guard bands -------------------------------------------------------------------------------------------------

_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
GUARD = 64  # bytes on each side of an output


class Guarded:
    """An output tensor of a given shape, strides and dtype carved from a larger byte buffer filled with
    ``SENTINEL``; ``check()`` asserts that no byte outside the tensor's elements changed (the guard bands
    and the gaps of a padded row stride)."""

    def __init__(self, shape, stride, dtype: torch.dtype, zero: bool = False):
        size = torch.empty((), dtype=dtype).element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
        self.buffer = torch.full((2 * GUARD + span * size,), SENTINEL, dtype=torch.uint8)
        self.tensor = self.buffer[GUARD:GUARD + span * size].view(dtype).as_strided(shape, stride)
        mask = torch.zeros_like(self.buffer)
        mask[GUARD:GUARD + span * size].view(_INT_VIEWS[size]).as_strided(shape, stride).fill_(-1 if size > 1 else 255)
        self.outside = mask == 0
        if zero:
            self.buffer[GUARD:GUARD + span * size].view(_INT_VIEWS[size]).as_strided(shape, stride).zero_()

    @classmethod
    def like(cls, t: torch.Tensor, pad: int = 0, zero: bool = False) -> Guarded:
        """Shaped like ``t``; a 2-D row-major ``t`` gets ``pad`` more elements of row stride (its strides kept
        otherwise, e.g. a column-major SF)."""
        stride = tuple(t.stride())
        if pad and t.dim() == 2 and t.stride(1) == 1 and t.shape[0] > 1:
            stride = (t.stride(0) + pad, 1)
        return cls(tuple(t.shape), stride, t.dtype, zero)

    def check(self, name: str = "out") -> None:
        changed = (self.buffer != SENTINEL) & self.outside
        if bool(changed.any()):
            first = int(changed.nonzero()[0]) - GUARD
            raise AssertionError(f"{name}: {int(changed.sum())} bytes outside the output changed "
                                 f"(first at byte offset {first} from the output's start)")


def guarded_like(data, t: torch.Tensor, *, zero: bool = False, label: str = "out") -> Guarded | None:
    """None (let the op allocate) or a sentinel-guarded tensor laid out like ``t`` (maybe with padded rows)."""
    if not data.draw(st.booleans(), label=f"preallocated {label}"):
        return None
    pad = data.draw(st.sampled_from([0, 3, 16]), label=f"{label} row padding")
    return Guarded.like(t, pad=pad, zero=zero)


# --- option coverage ---------------------------------------------------------------------------------------------

def drawn_values(cases: Iterable, **columns: Callable) -> dict[str, set]:
    """``{option: the values its column takes over cases}``: what a slow twin that samples ``cases``
    draws of each option (a column maps a case to the option's value)."""
    cases = list(cases)
    return {name: {column(case) for case in cases} for name, column in columns.items()}


def undrawn_option_values(drawn: dict[str, dict[str, Iterable]]) -> list[str]:
    """Each value the ``vmi`` command documents for an op's options (every choice of an option with
    choices, both values of a flag) that ``drawn[op][option]`` (what the op's slow property twins
    draw) lacks; also an enumerable option missing from ``drawn[op]`` and a name the op does not
    declare (a renamed option). Options documented as open ranges (no choices) are not enumerated."""
    problems = []
    for op, options in drawn.items():
        declared = {option.name: option for option in KERNEL_OPS[op].command.options}
        problems += [f"{op}: {name} is not an option of the op" for name in options if name not in declared]
        for name, option in declared.items():
            values = option.choices or ((False, True) if isinstance(option.default, bool) else ())
            if values and name not in options:
                problems.append(f"{op}: {name} is not listed")
            elif values:
                problems += [f"{op}: {name}={value!r} is never drawn" for value in values
                             if value not in set(options[name])]
    return problems


def assert_every_option_value_drawn(drawn: dict[str, dict[str, Iterable]]) -> None:
    """Fail listing every ``undrawn_option_values(drawn)``."""
    problems = undrawn_option_values(drawn)
    assert not problems, "documented option values the slow property twins do not draw:\n" + "\n".join(problems)
