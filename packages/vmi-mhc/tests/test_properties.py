"""Property tests (hypothesis): every kernel-level vmi-mhc op on the cpu target against its torch
reference (``vmi_mhc.reference``), both flavors, bit for bit, as the ops' own tests compare them:
NaN positions and every other bit, NaN signs and payloads aside (unspecified, each op page's "NaN
and infinities"), except the expand forward, a bit copy, which must keep NaN payloads too.

Drawn in every example: the flavor (``ascend``, ``cuda``); the entry point (``X`` or
``X_parallel``); the token count (0, 1, both sides of one and two work tiles: 64 tokens, 32 for the
prenorm GEMM; any count up to a size budget); data in one of three styles (normal samples; 40
binades with zero groups of both signs and rounding ties; multiples of 2^-8, whose short sums land
on bf16 ties) with special values at drawn places (signed zeros, subnormals, the largest finite
values, and in one example of two NaNs and infinities); each output that may be ``None`` either
allocated by the op or given, carved from a sentinel-filled buffer whose surrounding bytes must stay
untouched (in-place accumulation buffers are always given so). Per op, beyond that:

* expand: ``n`` 1-16, any ``H``, raw bf16 bit patterns (forward), all-zero tokens of either sign;
* pre_apply_mix: ``n`` 1-16 (forward, any ``H``), ``(n, H)`` up to ``max_hidden(n)`` (backward),
  ``mix`` as ``(T, n)`` or ``(T, n, 1)``, softmax weights, all-zero tokens;
* post: forward ``n`` 1-8, backward ``n = 4``, ``H`` from 1 to 8192, ``(B, S)``, ``residual`` and
  ``d_o`` contiguous or strided views;
* merge: ``m`` 1 to 32 (1, 2, 3, 4, 8, 16, 24, 31, 32), any ``K`` (0 included);
* reduce: ``n3`` 1 to 32 (1, 3, 5, 8, 24, 32), ``K`` 1 to 2^24, ``rms_eps`` 0 and positive,
  ``n_splits`` 1-64, partials with or without the group axis, tiny gradients (the ascend division
  flushes the quotients);
* prenorm GEMM: ``(K, n3, n_splits)`` with slices of 64 to 1792 columns, ``n3`` 1, 3, 5, 8, 24, 32, operands below
  2^-116 and NaNs whose payload TF32 drops, gradients with or without the group axis;
* sinkhorn: ``repeat`` 1-16 (backward) or up to 100 (forward), ``eps`` 0 to 1e6, logits offset
  by ±100 or spread until exp underflows;
* pre_split_mixes: the post multiplier (0, ±2^-126, any normal fp32), ``mhc_pre_eps`` (any finite
  fp32), logits where the sigmoid is subnormal or saturated;
* head_compute_mix: ``n`` 1-16, ``num_sms`` 1 to 2^20, ``token_block_size``, ``mhc_pre_eps``;
* pre_big_fuse: ``H`` 1 to 4160, ``rms_eps`` 0 and positive, ``n_splits`` 1-64 and every runtime
  scalar as for the unfused ops;
* multilayer_recompute: ``n`` 1-8, ``L`` 1-16 with ``L_post = L`` or ``L - 1``,
  ``H`` 1 to 8300, mixes ``(..., n, 1)`` or ``(..., n)``, leading dimensions ``(T,)`` or ``(B, S)``,
  input and output lists as layers of one buffer or separate tensors.

Each property runs twice: in the normal run with a quarter of the profile's examples
(``few_settings``: twenty properties share the normal run's time) and small shapes, over the kernel
specialisations the op's own default tests compile (``*_DEFAULT``: a cached kernel costs only its
run); and under ``@pytest.mark.slow`` with at least ``SLOW_EXAMPLES`` examples over the case tables
(``*_ALL``) that hold the option values above (a kernel is specialised on what the tables list, so
they name values instead of ranges). Profiles and replaying a failure: ``vmi_devkit.strategies``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import vmi_mhc
from vmi_core.formats import f32_from_bits
from vmi_core.tools.testing import assert_bitwise_equal, generator, randn
from vmi_devkit.strategies import (
    Guarded,
    assert_every_option_value_drawn,
    drawn_values,
    few_settings,
    float_matrix,
    load_profile,
    seeds,
    slow_settings,
    special_values,
)
from vmi_mhc.kernels.pre_apply_mix import max_hidden
from vmi_mhc.reference import expand as expand_reference
from vmi_mhc.reference import head_compute_mix as head_reference
from vmi_mhc.reference import multilayer_recompute as multilayer_reference
from vmi_mhc.reference import norm_fn as norm_fn_reference
from vmi_mhc.reference import post as post_reference
from vmi_mhc.reference import pre_apply_mix as pre_apply_mix_reference
from vmi_mhc.reference import pre_big_fuse as pre_big_fuse_reference
from vmi_mhc.reference import pre_norm_fn_gemm as gemm_reference
from vmi_mhc.reference import pre_split_mixes as split_reference
from vmi_mhc.reference import sinkhorn as sinkhorn_reference

# The default-budget tests run in the normal test command; their `slow` twins (>= 1000 examples
# each) run under `nox -s slow`, and CI's rotating share of the slow sweeps leaves them out.
pytestmark = [pytest.mark.properties]


load_profile()

FLAVORS = ("ascend", "cuda")
BF16 = torch.bfloat16
# Elements per example (the references are the cost): small in the normal run, larger in the slow one.
DEFAULT_BUDGET = 30_000
SLOW_BUDGET = 300_000


# --- drawing shapes, scalars and data ----------------------------------------------------------------------------

def draw_tokens(data, per_token: int, budget: int, *, tile: int = 64, limit: int = 200) -> int:
    """0, 1, both sides of ``tile`` and of two tiles, or any count up to ``limit``; at most ``budget``
    elements of ``per_token`` each (the references are the cost)."""
    most = max(2, min(limit, budget // max(per_token, 1)))
    edges = [t for t in (0, 1, 2, tile - 1, tile, tile + 1, 2 * tile + 1) if t <= most]
    return data.draw(st.one_of(st.sampled_from(edges), st.integers(0, most)), label="tokens")


def draw_hidden(data, most: int = 1300) -> int:
    """Any hidden size: one column, both sides of a 64-lane register and of a 512-column tile."""
    edges = [h for h in (1, 2, 63, 64, 65, 511, 512, 513, 1025) if h <= most]
    return data.draw(st.one_of(st.sampled_from(edges), st.integers(1, most)), label="hidden")


def draw_flavor(data) -> str:
    return data.draw(st.sampled_from(FLAVORS), label="flavor")


def draw_entry(data, name: str):
    """The public function ``name`` or its ``_parallel`` twin (the same kernel on cpu)."""
    return getattr(vmi_mhc, data.draw(st.sampled_from([name, f"{name}_parallel"]), label="entry"))


# 0 or a normal fp32 number, either sign (the backward divides by it).
POST_MULTS = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, -1.5, 2.0**-126, -(2.0**-126), 3.0e38]),
    st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda v: v == 0 or abs(v) >= 2.0**-126))
PRE_EPS = st.one_of(st.sampled_from([1e-2, 1e-6, 0.0, -0.0]),
                    st.floats(width=32, allow_nan=False, allow_infinity=False))
SINKHORN_EPS = st.one_of(st.sampled_from([1e-6, 1e-2, 0.0]), st.floats(0.0, 1e6, width=32))
# Sinkhorn iterations: the backward takes 1 to 16, the forward any count (long runs only in the slow
# twins: the ascend-flavor reference costs some 5 ms per iteration).
BACKWARD_REPEATS = st.integers(1, 16)
FORWARD_REPEATS_DEFAULT = BACKWARD_REPEATS
FORWARD_REPEATS_ALL = st.sampled_from([*range(1, 17), 17, 40, 100])
STYLES = ("spread", "normal", "grid")


def sprinkle(data, x: torch.Tensor, nonfinite: bool, most: int = 8) -> torch.Tensor:
    """``x`` (fp32) with up to ``most`` special values (``strategies.special_values``) at drawn places."""
    if not x.numel():
        return x
    count = data.draw(st.integers(0, most), label="num specials")
    if count:
        where = data.draw(st.lists(st.integers(0, x.numel() - 1), min_size=count, max_size=count), label="positions")
        what = data.draw(st.lists(special_values(nonfinite), min_size=count, max_size=count), label="specials")
        x = x.clone()
        x.view(-1)[torch.tensor(where)] = f32_from_bits(torch.tensor(what, dtype=torch.int64))
    return x


def values(data, shape, *, nonfinite: bool, dtype: torch.dtype = torch.float32, scale: float = 1.0,
           styles=STYLES, label: str = "x") -> torch.Tensor:
    """A contiguous ``shape`` tensor of one drawn style, with special values mixed in:

    * ``spread``: ``float_matrix`` (normal samples over 40 binades per row, zero groups of both
      signs, E4M3/E2M1 ties, special values);
    * ``normal``: normal samples;
    * ``grid``: multiples of 2^-8 up to 8 in magnitude, whose sums of a few terms land on bf16
      rounding ties;
    * ``softmax``: positive weights that sum to 1 per row (the v1 tests' mixes);

    times ``scale``, then cast to ``dtype``."""
    shape = tuple(shape)
    rows = shape[0] if len(shape) > 1 else 1
    cols = math.prod(shape[1:]) if len(shape) > 1 else math.prod(shape)
    style = data.draw(st.sampled_from(styles), label=f"{label} style")
    if style == "spread":
        x = float_matrix(data, rows, cols, torch.float32, nonfinite=nonfinite)
    else:
        seed = data.draw(seeds(), label=f"{label} seed")
        if style == "normal":
            x = randn((rows, cols), seed)
        elif style == "grid":
            x = torch.randint(-2048, 2049, (rows, cols), generator=generator(seed)).float() * 2.0**-8
        else:
            x = torch.softmax(randn((rows, cols), seed), dim=-1)
        x = sprinkle(data, x, nonfinite)
    return (x * scale).to(dtype).reshape(shape)


def draw_nonfinite(data) -> bool:
    return data.draw(st.booleans(), label="nonfinite")


def zero_tokens(data, x: torch.Tensor) -> torch.Tensor:
    """``x`` with a few drawn tokens (first axis) all +0 or all -0."""
    if not len(x):
        return x
    picks = data.draw(st.lists(st.integers(0, len(x) - 1), max_size=3), label="zero tokens")
    if picks:
        x = x.clone()
        for token in picks:
            x[token] = -0.0 if data.draw(st.booleans(), label="negative zero") else 0.0
    return x


def logits_at(data, x: torch.Tensor, gains: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``x`` (``(T, width)``) with a few entries set where the logit ``x·g + b`` lies near -88 (a
    subnormal sigmoid: the ascend division flushes it) or near ±30 (a saturated sigmoid)."""
    if not x.numel():
        return x
    count = data.draw(st.integers(0, 6), label="placed logits")
    if not count:
        return x
    x = x.clone()
    for _ in range(count):
        token = data.draw(st.integers(0, x.shape[0] - 1), label="token")
        entry = data.draw(st.integers(0, x.shape[1] - 1), label="entry")
        logit = data.draw(st.sampled_from([-88.0, -87.6, -88.5, 30.0, -30.0]), label="logit")
        if gains[entry] != 0:
            x[token, entry] = (logit - base[entry]) / gains[entry]
    return x


def gain_vector(data, size: int, nonfinite: bool, label: str) -> torch.Tensor:
    """Gains or biases: normal samples around ±1.5 of a drawn scale, maybe with special values."""
    seed = data.draw(seeds(), label=f"{label} seed")
    scale = data.draw(st.sampled_from([0.5, 1.0, 4.0]), label=f"{label} scale")
    g = randn((size,), seed) * scale + torch.where(torch.arange(size) % 2 == 0, 1.5, -1.5)
    return sprinkle(data, g, nonfinite, most=2)


# --- outputs -------------------------------------------------------------------------------------------------------

def row_major(shape) -> tuple:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


def guarded(shape, dtype: torch.dtype, init: torch.Tensor | None = None) -> Guarded:
    """A contiguous output inside a sentinel-filled buffer; ``init`` copied in (an accumulation buffer)."""
    guard = Guarded(tuple(shape), row_major(shape), dtype)
    if init is not None:
        guard.tensor.copy_(init)
    return guard


def maybe_guarded(data, shape, dtype: torch.dtype, label: str) -> Guarded | None:
    """None (the op allocates the output) or a given, guarded one."""
    return guarded(shape, dtype) if data.draw(st.booleans(), label=f"given {label}") else None


def given_tensor(guard: Guarded | None) -> torch.Tensor | None:
    return None if guard is None else guard.tensor


def check_outputs(what: str, names, got, want, guards=None, *, any_nan: bool = True) -> None:
    """Each output contiguous, the given one returned with its surroundings untouched, and bit for
    bit the reference's (NaN signs and payloads aside with ``any_nan``)."""
    guards = guards if guards is not None else [None] * len(names)
    for name, actual, expected, guard in zip(names, got, want, guards, strict=True):
        if guard is not None:
            assert actual is guard.tensor, f"{name} [{what}]: not the given output"
            guard.check(f"{name} [{what}]")
        assert actual.is_contiguous(), f"{name} [{what}]: not contiguous"
        assert_bitwise_equal(actual, expected, f"{name} [{what}]", check_stride=False, any_nan=any_nan)


# --- expand_to_mhc -----------------------------------------------------------------------------------------------

EXPAND_DEFAULT = [4]
EXPAND_ALL = list(range(1, 17))


def check_expand_fwd(data, stream_counts, budget):
    n = data.draw(st.sampled_from(stream_counts), label="n")
    flavor = draw_flavor(data)
    hidden = draw_hidden(data)
    tokens = draw_tokens(data, n * hidden, budget)
    if data.draw(st.booleans(), label="raw bits"):  # any bf16 pattern: NaN payloads, subnormals, signed zeros
        bits = torch.randint(-(2**15), 2**15, (tokens, hidden), generator=generator(data.draw(seeds())))
        x = bits.to(torch.int16).view(BF16)
    else:
        x = values(data, (tokens, hidden), nonfinite=draw_nonfinite(data), dtype=BF16)
    o = guarded((tokens, n, hidden), BF16)
    got = draw_entry(data, "expand_to_mhc_fwd")(x, o.tensor, target="cpu", flavor=flavor)
    what = f"n={n} T={tokens} H={hidden} {flavor}"
    check_outputs(what, ["o"], [got], [expand_reference.expand_to_mhc_fwd(x, n)], [o], any_nan=False)


def check_expand_bwd(data, stream_counts, budget):
    n = data.draw(st.sampled_from(stream_counts), label="n")
    flavor = draw_flavor(data)
    hidden = draw_hidden(data)
    tokens = draw_tokens(data, n * hidden, budget)
    o_grad = values(data, (tokens, n, hidden), nonfinite=draw_nonfinite(data), dtype=BF16)
    o_grad = zero_tokens(data, o_grad)
    x_grad = guarded((tokens, hidden), BF16)
    got = draw_entry(data, "expand_to_mhc_bwd")(o_grad, x_grad.tensor, target="cpu", flavor=flavor)
    check_outputs(f"n={n} T={tokens} H={hidden} {flavor}", ["x_grad"], [got],
                  [expand_reference.expand_to_mhc_bwd(o_grad)], [x_grad])


@few_settings()
@given(st.data())
def test_expand_to_mhc_fwd(data):
    check_expand_fwd(data, EXPAND_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_expand_to_mhc_fwd_slow(data):
    check_expand_fwd(data, EXPAND_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_expand_to_mhc_bwd(data):
    check_expand_bwd(data, EXPAND_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_expand_to_mhc_bwd_slow(data):
    check_expand_bwd(data, EXPAND_ALL, SLOW_BUDGET)


# --- pre_apply_mix -------------------------------------------------------------------------------------------------

# Forward kernels: (n, flavor); backward kernels: (n, H).
PAM_FWD_DEFAULT = [4]
PAM_FWD_ALL = list(range(1, 17))
PAM_BWD_DEFAULT = [(4, 200)]
PAM_BWD_ALL = ([(n, 1000) for n in range(1, 17)]
               + [(4, h) for h in (1, 64, 200, 1280, 4224, max_hidden(4))] + [(16, max_hidden(16))])


def draw_mix(data, tokens: int, n: int, nonfinite: bool) -> torch.Tensor:
    mix = values(data, (tokens, n), nonfinite=nonfinite, styles=(*STYLES, "softmax"), label="mix")
    return mix.unsqueeze(-1) if data.draw(st.booleans(), label="mix (T, n, 1)") else mix


def check_pre_apply_mix_fwd(data, stream_counts, budget):
    n = data.draw(st.sampled_from(stream_counts), label="n")
    flavor = draw_flavor(data)
    hidden = draw_hidden(data)
    tokens = draw_tokens(data, n * hidden, budget)
    nonfinite = draw_nonfinite(data)
    x = zero_tokens(data, values(data, (tokens, n, hidden), nonfinite=nonfinite, dtype=BF16))
    mix = draw_mix(data, tokens, n, nonfinite)
    o = guarded((tokens, hidden), BF16)
    got = draw_entry(data, "mhc_pre_apply_mix_fwd")(x, mix, o.tensor, target="cpu", flavor=flavor)
    want = pre_apply_mix_reference.mhc_pre_apply_mix_fwd(x, mix.reshape(tokens, n), flavor)
    check_outputs(f"n={n} T={tokens} H={hidden} mix={tuple(mix.shape)} {flavor}", ["o"], [got], [want], [o])


def check_pre_apply_mix_bwd(data, cases, budget):
    n, hidden = data.draw(st.sampled_from(cases), label="(n, H)")
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, 3 * n * hidden, budget)
    nonfinite = draw_nonfinite(data)
    o_grad = values(data, (tokens, hidden), nonfinite=nonfinite, dtype=BF16, label="o_grad")
    x = values(data, (tokens, n, hidden), nonfinite=nonfinite, dtype=BF16)
    mix = draw_mix(data, tokens, n, nonfinite)
    start = values(data, (tokens, n, hidden), nonfinite=nonfinite, dtype=BF16, label="x_grad")
    x_grad = guarded(start.shape, BF16, start)
    mix_grad = draw_entry(data, "mhc_pre_apply_mix_bwd")(o_grad, x, mix, x_grad.tensor, target="cpu", flavor=flavor)
    want = pre_apply_mix_reference.mhc_pre_apply_mix_bwd(o_grad, x, mix.reshape(tokens, n), start)
    check_outputs(f"n={n} T={tokens} H={hidden} mix={tuple(mix.shape)} {flavor}", ["x_grad", "mix_grad"],
                  [x_grad.tensor, mix_grad], want, [x_grad, None])


@few_settings()
@given(st.data())
def test_mhc_pre_apply_mix_fwd(data):
    check_pre_apply_mix_fwd(data, PAM_FWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_apply_mix_fwd_slow(data):
    check_pre_apply_mix_fwd(data, PAM_FWD_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_pre_apply_mix_bwd(data):
    check_pre_apply_mix_bwd(data, PAM_BWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_apply_mix_bwd_slow(data):
    check_pre_apply_mix_bwd(data, PAM_BWD_ALL, SLOW_BUDGET)


# --- post ------------------------------------------------------------------------------------------------------------

# Kernels: (n, H); the backward takes n = 4 only.
POST_HIDDEN = (1, 64, 96, 1280, 2600, 5000, 8192)
POST_FWD_DEFAULT = [(4, 2600)]
POST_FWD_ALL = [(n, 320) for n in range(1, 9)] + [(4, h) for h in POST_HIDDEN]
POST_BWD_DEFAULT = [(4, 2600)]
POST_BWD_ALL = [(4, h) for h in POST_HIDDEN]


def any_view(data, t: torch.Tensor, label: str) -> torch.Tensor:
    """``t`` itself, or an equal non-contiguous view: rows of a wider buffer, or the leading axes
    swapped in memory (``residual`` and ``d_o`` may be any view)."""
    layout = data.draw(st.sampled_from(["contiguous", "wider rows", "swapped"]), label=f"{label} layout")
    if layout == "wider rows":
        wide = torch.full((*t.shape[:-1], t.shape[-1] + 7), float("nan"), dtype=t.dtype)
        wide[..., :t.shape[-1]] = t
        return wide[..., :t.shape[-1]]
    if layout == "swapped":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


def post_inputs(data, cases, direction: str, budget: int):
    n, hidden = data.draw(st.sampled_from(cases), label="(n, H)")
    batch = data.draw(st.integers(1, 2), label="B")
    seq = draw_tokens(data, batch * 3 * n * hidden, budget)
    nonfinite = draw_nonfinite(data)
    inputs = {
        "x": values(data, (batch, seq, hidden), nonfinite=nonfinite, dtype=BF16),
        "residual": values(data, (batch, seq, n, hidden), nonfinite=nonfinite, dtype=BF16, label="residual"),
        "post_layer_mix": values(data, (batch, seq, n, 1), nonfinite=nonfinite, label="post"),
        "comb_res_mix": values(data, (batch, seq, n, n), nonfinite=nonfinite, label="comb"),
    }
    inputs["residual"] = any_view(data, inputs["residual"], "residual")
    if direction == "bwd":
        d_o = values(data, (batch, seq, n, hidden), nonfinite=nonfinite, dtype=BF16, label="d_o")
        inputs["d_o"] = any_view(data, d_o, "d_o")
    return inputs, f"n={n} B={batch} S={seq} H={hidden}"


def check_post_fwd(data, cases, budget):
    inputs, what = post_inputs(data, cases, "fwd", budget)
    flavor = draw_flavor(data)
    out = maybe_guarded(data, inputs["residual"].shape, BF16, "out")
    got = draw_entry(data, "mhc_post_fwd")(**inputs, out=given_tensor(out), target="cpu", flavor=flavor)
    check_outputs(f"{what} {flavor}", ["out"], [got], [post_reference.mhc_post_fwd(**inputs)], [out])


def check_post_bwd(data, cases, budget):
    inputs, what = post_inputs(data, cases, "bwd", budget)
    flavor = draw_flavor(data)
    got = draw_entry(data, "mhc_post_bwd")(**inputs, target="cpu", flavor=flavor)
    check_outputs(f"{what} {flavor}", ["d_x", "d_residual", "d_post_layer_mix", "d_comb_res_mix"], got,
                  post_reference.mhc_post_bwd(**inputs))


@few_settings()
@given(st.data())
def test_mhc_post_fwd(data):
    check_post_fwd(data, POST_FWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_post_fwd_slow(data):
    check_post_fwd(data, POST_FWD_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_post_bwd(data):
    check_post_bwd(data, POST_BWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_post_bwd_slow(data):
    check_post_bwd(data, POST_BWD_ALL, SLOW_BUDGET)


# --- norm_fn: the weight merge (stages A, A') ------------------------------------------------------------------------

# Kernels: the row count m (K is a runtime value).
MERGE_DEFAULT = [24]
MERGE_ALL = [1, 2, 3, 4, 8, 16, 24, 31, 32]


def merge_inputs(data, rows_choices, budget: int):
    rows = data.draw(st.sampled_from(rows_choices), label="m")
    most = min(1500, budget // (3 * rows))
    edges = [k for k in (0, 1, 127, 128, 129, 255, 256, 257) if k <= most]
    cols = data.draw(st.one_of(st.sampled_from(edges), st.integers(0, most)), label="K")
    nonfinite = draw_nonfinite(data)
    fn = values(data, (rows, cols), nonfinite=nonfinite, label="fn")
    normw = values(data, (cols,), nonfinite=nonfinite, label="normw")
    return rows, cols, nonfinite, fn, normw


def check_merge_fwd(data, rows_choices, budget):
    rows, cols, _, fn, normw = merge_inputs(data, rows_choices, budget)
    flavor = draw_flavor(data)
    out_fn = maybe_guarded(data, (rows, cols), torch.float32, "out_fn")
    got = draw_entry(data, "mhc_fn_normw_merge_fwd")(fn, normw, given_tensor(out_fn), target="cpu", flavor=flavor)
    check_outputs(f"m={rows} K={cols} {flavor}", ["out_fn"], [got], [norm_fn_reference.fn_normw_merge_fwd(fn, normw)],
                  [out_fn])


def check_merge_bwd(data, rows_choices, budget):
    rows, cols, nonfinite, fn, normw = merge_inputs(data, rows_choices, budget)
    flavor = draw_flavor(data)
    out_fn_grad = values(data, (rows, cols), nonfinite=nonfinite, label="out_fn_grad")
    fn_grad_start = values(data, (rows, cols), nonfinite=nonfinite, label="fn_grad")
    normw_grad_start = values(data, (cols,), nonfinite=nonfinite, label="normw_grad")
    fn_grad = guarded((rows, cols), torch.float32, fn_grad_start)
    normw_grad = guarded((cols,), torch.float32, normw_grad_start)
    got = draw_entry(data, "mhc_fn_normw_merge_bwd")(fn, normw, out_fn_grad, fn_grad.tensor, normw_grad.tensor,
                                                      target="cpu", flavor=flavor)
    want = norm_fn_reference.fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad_start, normw_grad_start)
    check_outputs(f"m={rows} K={cols} {flavor}", ["fn_grad", "normw_grad"], got, want, [fn_grad, normw_grad])


@few_settings()
@given(st.data())
def test_mhc_fn_normw_merge_fwd(data):
    check_merge_fwd(data, MERGE_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_fn_normw_merge_fwd_slow(data):
    check_merge_fwd(data, MERGE_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_fn_normw_merge_bwd(data):
    check_merge_bwd(data, MERGE_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_fn_normw_merge_bwd_slow(data):
    check_merge_bwd(data, MERGE_ALL, SLOW_BUDGET)


# --- norm_fn: the split reduction and RMS scale (stages C, D) ---------------------------------------------------------

# Kernels: (n3, K, rms_eps, flavor); token and split counts are runtime values. K from 1 to 2^24,
# n3 from 1 to 32, eps 0 and positive.
REDUCE_DEFAULT = [(24, 5120, 1e-6, flavor) for flavor in FLAVORS]
REDUCE_ALL = REDUCE_DEFAULT + [
    (24, 5120, 0.0, "ascend"), (24, 5120, 0.0, "cuda"), (24, 4 * 2560, 1e-6, "cuda"), (24, 4 * 7168, 1e-6, "ascend"),
    (1, 5120, 1e-6, "ascend"), (8, 5120, 1e-6, "ascend"), (32, 5120, 1e-6, "ascend"), (32, 5120, 1e-6, "cuda"),
    (3, 1, 1e-6, "cuda"), (5, 4, 0.5, "ascend"), (24, 2**24, 1e-6, "ascend"), (24, 2**24, 1e-6, "cuda"),
]


def square_sums(data, shape, nonfinite: bool, scale: float, label: str) -> torch.Tensor:
    """Square sums: magnitudes (+0 included) of drawn values, NaN and +inf among the specials."""
    return values(data, shape, nonfinite=nonfinite, scale=scale, label=label).abs()


def check_reduce_fwd(data, cases, budget):
    mix, group_size, eps, flavor = data.draw(st.sampled_from(cases), label="(n3, K, eps, flavor)")
    splits = data.draw(st.one_of(st.sampled_from([1, 2, 16, 64]), st.integers(1, 64)), label="n_splits")
    tokens = draw_tokens(data, splits * (mix + 1), budget)
    nonfinite = draw_nonfinite(data)
    scale = data.draw(st.sampled_from([1.0, float(group_size), 2.0**-100]), label="scale")
    partials = values(data, (splits, tokens, 1, mix), nonfinite=nonfinite, scale=scale, label="partials")
    sqrsums = square_sums(data, (splits, tokens, 1), nonfinite, scale, "sqrsums")
    want = norm_fn_reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, group_size, eps, flavor)
    if data.draw(st.booleans(), label="no group axis"):  # (S, T, n3) and (S, T), as the GEMM writes them
        partials, sqrsums = partials[:, :, 0], sqrsums[:, :, 0]
    outs = [maybe_guarded(data, shape, torch.float32, name)
            for shape, name in (((tokens, 1, mix), "out_mul"), ((tokens, 1), "sqrsum"), ((tokens, mix), "out"))]
    got = draw_entry(data, "mhc_reduce_partials_and_rmsnorm_fwd")(
        partials, sqrsums, *map(given_tensor, outs), group_size, eps, splits, target="cpu", flavor=flavor)
    check_outputs(f"n3={mix} K={group_size} eps={eps} S={splits} T={tokens} {flavor}", ["out_mul", "sqrsum", "out"],
                  got, want, outs)


def check_reduce_bwd(data, cases, budget):
    mix, group_size, eps, flavor = data.draw(st.sampled_from(cases), label="(n3, K, eps, flavor)")
    tokens = draw_tokens(data, 2 * mix + 1, budget)
    nonfinite = draw_nonfinite(data)
    # Tiny gradients make the quotients subnormal: the ascend flavor flushes them.
    grad_scale = data.draw(st.sampled_from([1.0, 2.0**-60, 2.0**-120]), label="out_grad scale")
    out_grad = values(data, (tokens, mix), nonfinite=nonfinite, scale=grad_scale, label="out_grad")
    out_mul = values(data, (tokens, 1, mix), nonfinite=nonfinite, label="out_mul")
    sqrsum = square_sums(data, (tokens, 1), nonfinite, float(group_size), "sqrsum")
    outs = [maybe_guarded(data, shape, torch.float32, name)
            for shape, name in (((tokens, 1, mix), "out_mul_grad"), ((tokens, 1), "sqrsum_grad"))]
    got = draw_entry(data, "mhc_reduce_partials_and_rmsnorm_bwd")(
        out_grad, out_mul, sqrsum, *map(given_tensor, outs), group_size, eps, target="cpu", flavor=flavor)
    want = norm_fn_reference.reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, group_size, eps, flavor)
    check_outputs(f"n3={mix} K={group_size} eps={eps} T={tokens} {flavor}", ["out_mul_grad", "sqrsum_grad"], got,
                  want, outs)


@few_settings()
@given(st.data())
def test_mhc_reduce_partials_and_rmsnorm_fwd(data):
    check_reduce_fwd(data, REDUCE_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_reduce_partials_and_rmsnorm_fwd_slow(data):
    check_reduce_fwd(data, REDUCE_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_reduce_partials_and_rmsnorm_bwd(data):
    check_reduce_bwd(data, REDUCE_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_reduce_partials_and_rmsnorm_bwd_slow(data):
    check_reduce_bwd(data, REDUCE_ALL, SLOW_BUDGET)


# --- pre_norm_fn_gemm (stages B, E) -----------------------------------------------------------------------------------

# Forward kernels: (K, n3, n_splits) with K / n_splits a multiple of 64; backward kernels: (K, n3)
# with K a multiple of 256. n3 from 1 to 32.
GEMM_FWD_DEFAULT = [(512, 24, 2)]
GEMM_FWD_ALL = GEMM_FWD_DEFAULT + [(512, 24, 1), (512, 24, 8), (64, 24, 1), (192, 3, 3), (1024, 1, 4), (1024, 8, 4),
                                   (1024, 32, 4), (5120, 24, 16), (4 * 7168, 24, 16)]
GEMM_BWD_DEFAULT = [(512, 24)]
GEMM_BWD_ALL = GEMM_BWD_DEFAULT + [(256, 24), (256, 5), (1024, 1), (1024, 8), (1024, 32), (5120, 24)]


def gemm_operand(data, shape, nonfinite: bool, label: str) -> torch.Tensor:
    """fp32 operands of the TF32 rounding: drawn values of a drawn magnitude (below 2^-116 the bf16
    ``lo`` half loses bits), NaNs whose payload lies only in the dropped bits among the specials."""
    scale = data.draw(st.sampled_from([1.0, 1e-2, 2.0**-120]), label=f"{label} scale")
    t = values(data, shape, nonfinite=nonfinite, scale=scale, label=label)
    if nonfinite and t.numel() and data.draw(st.booleans(), label=f"{label} low-payload NaN"):
        t.view(-1)[data.draw(st.integers(0, t.numel() - 1))] = f32_from_bits(torch.tensor(0x7F800001))
    return t


def check_gemm_fwd(data, cases, budget):
    hidden, mix, splits = data.draw(st.sampled_from(cases), label="(K, n3, n_splits)")
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, hidden, budget, tile=32, limit=100)
    nonfinite = draw_nonfinite(data)
    x = values(data, (tokens, hidden), nonfinite=nonfinite, dtype=BF16)
    fn = gemm_operand(data, (mix, hidden), nonfinite, "fn")
    outs = [maybe_guarded(data, shape, torch.float32, name)
            for shape, name in (((splits, tokens, mix), "out_mul_splitted"), ((splits, tokens), "sqrsum_splitted"))]
    got = draw_entry(data, "mhc_pre_norm_fn_gemm_fwd")(x, fn, *map(given_tensor, outs), splits, target="cpu",
                                                        flavor=flavor)
    check_outputs(f"K={hidden} n3={mix} S={splits} T={tokens} {flavor}", ["out_mul_splitted", "sqrsum_splitted"],
                  got, gemm_reference.pre_norm_fn_gemm_fwd(x, fn, splits), outs)


def check_gemm_bwd(data, cases, budget):
    hidden, mix = data.draw(st.sampled_from(cases), label="(K, n3)")
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, hidden, budget, tile=32, limit=100)
    nonfinite = draw_nonfinite(data)
    out_mul_grad = gemm_operand(data, (tokens, mix), nonfinite, "out_mul_grad")
    sqrsum_grad = values(data, (tokens,), nonfinite=nonfinite, scale=1e-3, label="sqrsum_grad")
    x = values(data, (tokens, hidden), nonfinite=nonfinite, dtype=BF16)
    fn = gemm_operand(data, (mix, hidden), nonfinite, "fn")
    start = values(data, (tokens, hidden), nonfinite=nonfinite, dtype=BF16, label="x_grad")
    want = gemm_reference.pre_norm_fn_gemm_bwd(out_mul_grad, sqrsum_grad, x, fn, start)
    if data.draw(st.booleans(), label="group axis"):  # (T, 1, n3) and (T, 1), as stage D writes them
        out_mul_grad, sqrsum_grad = out_mul_grad.unsqueeze(1), sqrsum_grad.unsqueeze(1)
    x_grad = guarded((tokens, hidden), BF16, start)
    fn_grad = maybe_guarded(data, (mix, hidden), torch.float32, "fn_grad")
    got = draw_entry(data, "mhc_pre_norm_fn_gemm_bwd")(out_mul_grad, sqrsum_grad, x, fn, x_grad.tensor,
                                                        given_tensor(fn_grad), target="cpu", flavor=flavor)
    check_outputs(f"K={hidden} n3={mix} T={tokens} {flavor}", ["x_grad", "fn_grad"], got, want, [x_grad, fn_grad])


@few_settings()
@given(st.data())
def test_mhc_pre_norm_fn_gemm_fwd(data):
    check_gemm_fwd(data, GEMM_FWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_norm_fn_gemm_fwd_slow(data):
    check_gemm_fwd(data, GEMM_FWD_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_pre_norm_fn_gemm_bwd(data):
    check_gemm_bwd(data, GEMM_BWD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_norm_fn_gemm_bwd_slow(data):
    check_gemm_bwd(data, GEMM_BWD_ALL, SLOW_BUDGET)


# --- sinkhorn ---------------------------------------------------------------------------------------------------------

# Kernels: the flavor (repeat and eps are runtime values), so both budgets draw everything.

def sinkhorn_logits(data, tokens: int, nonfinite: bool) -> torch.Tensor:
    """Logits of a drawn spread (exp underflows for wide rows), offset by ±100 (spec §3.9.5) or not."""
    scale = data.draw(st.sampled_from([1.0, 4.0, 30.0]), label="logit scale")
    offset = data.draw(st.sampled_from([0.0, 100.0, -100.0]), label="logit offset")
    return values(data, (tokens, 4, 4), nonfinite=nonfinite, scale=scale, label="logits") + offset


def check_sinkhorn_fwd(data, repeats, budget):
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, 16, budget)
    logits = sinkhorn_logits(data, tokens, draw_nonfinite(data))
    repeat = data.draw(repeats, label="repeat")
    eps = data.draw(SINKHORN_EPS, label="eps")
    out = maybe_guarded(data, logits.shape, torch.float32, "out")
    got = draw_entry(data, "mhc_sinkhorn_fwd")(logits, given_tensor(out), repeat, eps, target="cpu", flavor=flavor)
    check_outputs(f"T={tokens} repeat={repeat} eps={eps} {flavor}", ["comb_res_mix_out"], [got],
                  [sinkhorn_reference.sinkhorn_forward(logits, repeat, eps, flavor)], [out])


def check_sinkhorn_bwd(data, budget):
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, 16, budget)
    nonfinite = draw_nonfinite(data)
    logits = sinkhorn_logits(data, tokens, nonfinite)
    grad = values(data, (tokens, 4, 4), nonfinite=nonfinite, label="grad_output")
    repeat = data.draw(BACKWARD_REPEATS, label="repeat")
    eps = data.draw(SINKHORN_EPS, label="eps")
    out = maybe_guarded(data, logits.shape, torch.float32, "grad_input")
    got = draw_entry(data, "mhc_sinkhorn_bwd")(grad, logits, given_tensor(out), repeat, eps, target="cpu",
                                                flavor=flavor)
    check_outputs(f"T={tokens} repeat={repeat} eps={eps} {flavor}", ["grad_input"], [got],
                  [sinkhorn_reference.sinkhorn_backward(grad, logits, repeat, eps, flavor)], [out])


@few_settings()
@given(st.data())
def test_mhc_sinkhorn_fwd(data):
    check_sinkhorn_fwd(data, FORWARD_REPEATS_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_sinkhorn_fwd_slow(data):
    check_sinkhorn_fwd(data, FORWARD_REPEATS_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_sinkhorn_bwd(data):
    check_sinkhorn_bwd(data, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_sinkhorn_bwd_slow(data):
    check_sinkhorn_bwd(data, SLOW_BUDGET)


# --- pre_split_mixes --------------------------------------------------------------------------------------------------

# Kernels: the flavor (tokens, post multiplier and pre epsilon are runtime values).

def split_inputs(data, budget: int):
    flavor = draw_flavor(data)
    tokens = draw_tokens(data, 60, budget)
    nonfinite = draw_nonfinite(data)
    scale = gain_vector(data, 3, nonfinite, "mhc_scale")
    base = gain_vector(data, 24, nonfinite, "mhc_base")
    mixes = values(data, (tokens, 24), nonfinite=nonfinite, scale=2.0, label="input_mixes")
    mixes = logits_at(data, mixes, scale[split_reference.gain_index(4)], base)
    post_mult = data.draw(POST_MULTS, label="mhc_post_mult_value")
    return flavor, tokens, nonfinite, scale, base, mixes, post_mult


def check_split_fwd(data, budget):
    flavor, tokens, _, scale, base, mixes, post_mult = split_inputs(data, budget)
    pre_eps = data.draw(PRE_EPS, label="mhc_pre_eps")
    outs = [maybe_guarded(data, shape, torch.float32, name) for shape, name in
            (((tokens, 4), "pre_layer_mix"), ((tokens, 4), "post_layer_mix"), ((tokens, 16), "comb_res_mix"))]
    got = draw_entry(data, "mhc_pre_split_mixes_fwd")(mixes, scale, base, *map(given_tensor, outs), post_mult,
                                                       pre_eps, target="cpu", flavor=flavor)
    want = split_reference.pre_split_mixes_fwd(mixes, scale, base, post_mult, pre_eps, flavor)
    check_outputs(f"T={tokens} m={post_mult} pre_eps={pre_eps} {flavor}",
                  ["pre_layer_mix", "post_layer_mix", "comb_res_mix"], got, want, outs)


def check_split_bwd(data, budget):
    flavor, tokens, nonfinite, scale, base, mixes, post_mult = split_inputs(data, budget)
    # The forward's post mix, as the backward documents it (from the reference: no kernel output feeds a check).
    post = split_reference.pre_split_mixes_fwd(mixes, scale, base, post_mult, 0.0, flavor)[1]
    grads = [values(data, (tokens, width), nonfinite=nonfinite, label=name)
             for width, name in ((4, "pre_layer_mix_grad"), (4, "post_layer_mix_grad"), (16, "comb_res_mix_grad"))]
    outs = [maybe_guarded(data, shape, torch.float32, name) for shape, name in
            (((tokens, 24), "input_mixes_grad"), ((3,), "mhc_scale_grad"), ((24,), "mhc_base_grad"))]
    got = draw_entry(data, "mhc_pre_split_mixes_bwd")(*grads, mixes, post, scale, base, *map(given_tensor, outs),
                                                       post_mult, target="cpu", flavor=flavor)
    want = split_reference.pre_split_mixes_bwd(*grads, mixes, post, scale, base, post_mult, flavor)
    check_outputs(f"T={tokens} m={post_mult} {flavor}", ["input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"], got,
                  want, outs)


@few_settings()
@given(st.data())
def test_mhc_pre_split_mixes_fwd(data):
    check_split_fwd(data, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_split_mixes_fwd_slow(data):
    check_split_fwd(data, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_pre_split_mixes_bwd(data):
    check_split_bwd(data, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_split_mixes_bwd_slow(data):
    check_split_bwd(data, SLOW_BUDGET)


# --- head_compute_mix -------------------------------------------------------------------------------------------------

# Kernels: (n, flavor); tokens, num_sms and token_block_size are runtime values.
HEAD_DEFAULT = [(4, flavor) for flavor in FLAVORS]
HEAD_ALL = [(n, flavor) for n in range(1, 17) for flavor in FLAVORS]
# Partial rows: 1 to 2^20 (the largest only in the slow twins, and rarely: its outputs are 2^20 rows).
NUM_SMS_DEFAULT = st.one_of(st.sampled_from([1, 2, 5, 64, 264]), st.integers(1, 300))
NUM_SMS_ALL = st.one_of(st.sampled_from([1, 2, 5, 64, 264, 2**20]), st.integers(1, 300))
TOKEN_BLOCK_SIZES = st.one_of(st.sampled_from([0, 1, 32, 64]), st.integers(0, 2**20))


def head_inputs(data, cases, budget: int):
    n, flavor = data.draw(st.sampled_from(cases), label="(n, flavor)")
    tokens = draw_tokens(data, 3 * n, budget)
    nonfinite = draw_nonfinite(data)
    scale = gain_vector(data, 1, nonfinite, "mhc_scale")
    base = gain_vector(data, n, nonfinite, "mhc_base")
    mix = values(data, (tokens, n), nonfinite=nonfinite, scale=2.0, label="input_mix")
    mix = logits_at(data, mix, scale.expand(n), base)
    block = data.draw(TOKEN_BLOCK_SIZES, label="token_block_size")
    return n, flavor, tokens, nonfinite, scale, base, mix, block


def check_head_fwd(data, cases, budget):
    n, flavor, tokens, _, scale, base, mix, block = head_inputs(data, cases, budget)
    pre_eps = data.draw(PRE_EPS, label="mhc_pre_eps")
    out = maybe_guarded(data, (tokens, n), torch.float32, "output_mix")
    got = draw_entry(data, "mhc_head_compute_mix_fwd")(mix, scale, base, given_tensor(out), pre_eps, block,
                                                        target="cpu", flavor=flavor)
    want = head_reference.head_compute_mix_fwd(mix, scale, base, pre_eps, flavor)
    check_outputs(f"n={n} T={tokens} pre_eps={pre_eps} block={block} {flavor}", ["output_mix"], [got], [want], [out])


def check_head_bwd(data, cases, row_counts, budget):
    n, flavor, tokens, nonfinite, scale, base, mix, block = head_inputs(data, cases, budget)
    num_sms = data.draw(row_counts, label="num_sms")
    out_grad = values(data, (tokens, n), nonfinite=nonfinite, label="output_mix_grad")
    outs = [maybe_guarded(data, shape, torch.float32, name) for shape, name in
            (((tokens, n), "input_mix_grad"), ((num_sms, 1), "mhc_scale_grad_partial"),
             ((num_sms, n), "mhc_base_grad_partial"))]
    got = draw_entry(data, "mhc_head_compute_mix_bwd")(out_grad, mix, scale, base, *map(given_tensor, outs), num_sms,
                                                        block, target="cpu", flavor=flavor)
    want = head_reference.head_compute_mix_bwd(out_grad, mix, scale, base, num_sms, flavor)
    check_outputs(f"n={n} T={tokens} P={num_sms} block={block} {flavor}",
                  ["input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial"], got, want, outs)


@few_settings()
@given(st.data())
def test_mhc_head_compute_mix_fwd(data):
    check_head_fwd(data, HEAD_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_head_compute_mix_fwd_slow(data):
    check_head_fwd(data, HEAD_ALL, SLOW_BUDGET)


@few_settings()
@given(st.data())
def test_mhc_head_compute_mix_bwd(data):
    check_head_bwd(data, HEAD_DEFAULT, NUM_SMS_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_head_compute_mix_bwd_slow(data):
    check_head_bwd(data, HEAD_ALL, NUM_SMS_ALL, SLOW_BUDGET)


# --- pre_big_fuse -----------------------------------------------------------------------------------------------------

# Kernels: (n·H, rms_eps, flavor) with n = 4; tokens, splits, the other scalars and repeat are
# runtime values.
BIG_FUSE_DEFAULT = [(1280, 1e-6, flavor) for flavor in FLAVORS]
BIG_FUSE_ALL = BIG_FUSE_DEFAULT + [(80, 1e-6, "ascend"), (80, 1e-6, "cuda"), (4160, 1e-6, "ascend"),
                                   (4160, 1e-6, "cuda"), (1280, 0.0, "ascend"), (1, 1e-6, "cuda"),
                                   (300, 1e-2, "ascend")]


def check_pre_big_fuse(data, cases, repeats, budget):
    hidden, rms_eps, flavor = data.draw(st.sampled_from(cases), label="(H, rms_eps, flavor)")
    splits = data.draw(st.one_of(st.sampled_from([1, 16, 64]), st.integers(1, 64)), label="n_splits")
    tokens = draw_tokens(data, 6 * hidden + 25 * splits, budget)
    nonfinite = draw_nonfinite(data)
    residual = zero_tokens(data, values(data, (tokens, 4, hidden), nonfinite=nonfinite, dtype=BF16,
                                        label="residual"))
    # Partials of the size the prenorm GEMM gives (products ~ fn 1e-2 over K / S terms), or spread.
    scale = data.draw(st.sampled_from([1.0, 1e-2 * (4 * hidden / splits) ** 0.5]), label="partials scale")
    partials = values(data, (splits, tokens, 24), nonfinite=nonfinite, scale=scale, label="gemm_out_mul")
    sqrsums = square_sums(data, (splits, tokens), nonfinite, 4 * hidden / splits, "gemm_out_sqrsum")
    gains = gain_vector(data, 3, nonfinite, "mhc_scale")
    base = gain_vector(data, 24, nonfinite, "mhc_base")
    scalars = dict(rms_eps=rms_eps, mhc_pre_eps=data.draw(PRE_EPS, label="mhc_pre_eps"),
                   mhc_sinkhorn_eps=data.draw(SINKHORN_EPS, label="mhc_sinkhorn_eps"),
                   mhc_post_mult_value=data.draw(POST_MULTS, label="mhc_post_mult_value"),
                   sinkhorn_repeat=data.draw(repeats, label="sinkhorn_repeat"))
    outs = [maybe_guarded(data, shape, dtype, name) for shape, dtype, name in
            (((tokens, 4), torch.float32, "post_mix"), ((tokens, 16), torch.float32, "comb_mix"),
             ((tokens, hidden), BF16, "layer_input"))]
    got = draw_entry(data, "mhc_pre_big_fuse_fwd")(partials, sqrsums, gains, base, residual, *map(given_tensor, outs),
                                                    **scalars, n_splits=splits, target="cpu", flavor=flavor)
    want = pre_big_fuse_reference.pre_big_fuse_fwd(partials, sqrsums, gains, base, residual, **scalars, flavor=flavor)
    check_outputs(f"H={hidden} S={splits} T={tokens} {scalars} {flavor}", ["post_mix", "comb_mix", "layer_input"],
                  got, want, outs)


@few_settings()
@given(st.data())
def test_mhc_pre_big_fuse_fwd(data):
    check_pre_big_fuse(data, BIG_FUSE_DEFAULT, FORWARD_REPEATS_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_pre_big_fuse_fwd_slow(data):
    check_pre_big_fuse(data, BIG_FUSE_ALL, FORWARD_REPEATS_ALL, SLOW_BUDGET)


# --- multilayer_recompute ---------------------------------------------------------------------------------------------

# Kernels: (n, H, L, L_post, flavor). Every n from 1 to 8, every L from 1 to 16 (1, 10 and 16 with
# L_post = L and L - 1), hidden sizes from one column to several tiles.
MULTILAYER_DEFAULT = [(4, 1000, 3, 2, flavor) for flavor in FLAVORS]
MULTILAYER_ALL = (
    MULTILAYER_DEFAULT
    + [(4, 1000, layers, post, flavor) for layers, post in ((1, 0), (1, 1), (2, 1), (3, 3), (10, 9), (10, 10),
                                                            (16, 16)) for flavor in FLAVORS]
    + [(4, 1000, 16, 15, "ascend")]
    + [(n, 320, 3, 2, "cuda") for n in (1, 2, 3, 8)] + [(n, 320, 3, 2, "ascend") for n in (5, 6, 7)]
    + [(4, h, 3, 2, "ascend") for h in (1, 64, 96, 8300)] + [(4, 8300, 3, 2, "cuda")]
    + [(4, 320, layers, layers - layers % 2, FLAVORS[layers % 2]) for layers in (4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15)])


def layer_list(data, count: int, shape, dtype, nonfinite: bool, label: str) -> list[torch.Tensor]:
    """``count`` tensors of ``shape``: views of one ``(count, *shape)`` buffer (addressed in place)
    or separate tensors (stacked by the dispatch)."""
    whole = values(data, (count, *shape), nonfinite=nonfinite, dtype=dtype, label=label)
    if data.draw(st.booleans(), label=f"{label} one buffer"):
        return list(whole.unbind(0))
    return [t.clone() for t in whole.unbind(0)]


def mix_tail(data, n: int, label: str) -> tuple:
    """The trailing axes of a pre or post mix: ``(n, 1)`` or ``(n,)``."""
    return (n, 1) if data.draw(st.booleans(), label=f"{label} (..., n, 1)") else (n,)


def output_list(data, count: int, shape, label: str) -> tuple[list[torch.Tensor], list[Guarded]]:
    """``count`` guarded bf16 outputs: layers of one buffer, or one buffer each."""
    if data.draw(st.booleans(), label=f"{label} one buffer"):
        guard = guarded((count, *shape), BF16)
        return list(guard.tensor.unbind(0)), [guard]
    guards = [guarded(shape, BF16) for _ in range(count)]
    return [g.tensor for g in guards], guards


def check_multilayer(data, cases, budget):
    n, hidden, layers, post_layers, flavor = data.draw(st.sampled_from(cases), label="(n, H, L, L_post, flavor)")
    batch = data.draw(st.integers(1, 2), label="B")
    seq = draw_tokens(data, batch * layers * 3 * n * hidden, budget)
    lead = data.draw(st.sampled_from([(batch * seq,), (batch, seq)]), label="leading dims")
    nonfinite = draw_nonfinite(data)
    residual = values(data, (*lead, n, hidden), nonfinite=nonfinite, dtype=BF16, label="initial_residual")
    inputs = dict(
        initial_residual=zero_tokens(data, residual.reshape(-1, n, hidden)).reshape(residual.shape),
        pre_mix_list=layer_list(data, layers, (*lead, *mix_tail(data, n, "pre")), torch.float32, nonfinite, "pre_mix"),
        layer_output_list=layer_list(data, post_layers, (*lead, hidden), BF16, nonfinite, "layer_output"),
        post_mix_list=layer_list(data, post_layers, (*lead, *mix_tail(data, n, "post")), torch.float32, nonfinite,
                                 "post_mix"),
        comb_mix_list=layer_list(data, post_layers, (*lead, n, n), torch.float32, nonfinite, "comb_mix"))
    layer_inputs, input_guards = output_list(data, layers, (*lead, hidden), "layer_input")
    residuals, residual_guards = output_list(data, post_layers, (*lead, n, hidden), "residual")
    got = draw_entry(data, "mhc_multilayer_recompute")(**inputs, layer_input_list=layer_inputs,
                                                        residual_list=residuals, target="cpu", flavor=flavor)
    assert got[0] is layer_inputs and got[1] is residuals
    want = multilayer_reference.mhc_multilayer_recompute(*inputs.values(), flavor)
    what = f"n={n} H={hidden} L={layers} L_post={post_layers} lead={lead} {flavor}"
    check_outputs(what, [f"layer_input[{k}]" for k in range(layers)], layer_inputs, want[0])
    check_outputs(what, [f"residual[{k}]" for k in range(post_layers)], residuals, want[1])
    for k, guard in enumerate(input_guards + residual_guards):
        guard.check(f"output buffer {k} [{what}]")


@few_settings()
@given(st.data())
def test_mhc_multilayer_recompute(data):
    check_multilayer(data, MULTILAYER_DEFAULT, DEFAULT_BUDGET)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mhc_multilayer_recompute_slow(data):
    check_multilayer(data, MULTILAYER_ALL, SLOW_BUDGET)


# --- what the slow twins draw ---------------------------------------------------------------------------------------

# Per op, the values of each option ``vmi run OP -o name=value`` documents that the slow twins draw
# (from the case tables they sample; n_splits of the reduction and pre_big_fuse from st.integers(1, 64));
# a documented value no twin draws fails the test below.
DRAWN = {
    "expand_to_mhc_fwd": {"mhc_mult": EXPAND_ALL},
    "expand_to_mhc_bwd": {"mhc_mult": EXPAND_ALL},
    "mhc_pre_apply_mix_fwd": {"mhc_mult": PAM_FWD_ALL},
    "mhc_pre_apply_mix_bwd": drawn_values(PAM_BWD_ALL, mhc_mult=lambda c: c[0]),
    "mhc_post_fwd": drawn_values(POST_FWD_ALL, mhc_mult=lambda c: c[0]),
    "mhc_reduce_partials_and_rmsnorm_fwd": {"n_splits": range(1, 65)},
    "mhc_pre_norm_fn_gemm_fwd": drawn_values(GEMM_FWD_ALL, mix=lambda c: c[1], n_splits=lambda c: c[2]),
    "mhc_pre_norm_fn_gemm_bwd": drawn_values(GEMM_BWD_ALL, mix=lambda c: c[1]),
    "mhc_head_compute_mix_fwd": drawn_values(HEAD_ALL, mhc_mult=lambda c: c[0]),
    "mhc_head_compute_mix_bwd": drawn_values(HEAD_ALL, mhc_mult=lambda c: c[0]),
    "mhc_pre_big_fuse_fwd": {"n_splits": range(1, 65)},
    "mhc_multilayer_recompute": drawn_values(MULTILAYER_ALL, mhc_mult=lambda c: c[0], num_layers=lambda c: c[2],
                                             last_post=lambda c: c[3] == c[2]),
}


def test_the_slow_twins_draw_every_documented_option_value():
    assert_every_option_value_drawn(DRAWN)
