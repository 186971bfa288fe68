"""Property tests (hypothesis) of the vmi-quant ops that ``test_properties.py`` (the casts) leaves
out: per_channel_cast, norm_forward and norm_forward_and_per_token_cast, norm_backward, swiglu_forward
and swiglu_forward_and_per_token_cast, swiglu_forward_and_per_channel_cast_and_transpose,
swiglu_backward and swiglu_backward_and_per_token_cast, batched_transpose_weight_sf. Each runs on the
cpu target against its torch reference, in the flavor its case names.

Drawn: token counts (0, 1, work-tile tails, several tiles), hidden sizes within each op's
constraints (or, where the hidden size is part of the kernel's specialisation, the case's), row and
batch strides, 3-D inputs, psum expert layouts (empty experts, experts ending before their aligned
start, rows after the last expert, token alignments 1 to 128) whose padding rows hold garbage,
clamp values, weights and scaling factors, preallocated outputs carved from sentinel-filled buffers
(the bytes around them must stay untouched), and data with special values mixed in.

Comparisons are what the ops promise: bit for bit (data, SF, counters, and every NaN canonical)
except where a doc leaves the NaN payload open (norm_backward, swiglu_backward's bf16/fp32 outputs:
NaN positions and every other bit). swiglu_backward leaves the clamp of a NaN input open, so with a
clamp its NaN inputs become +inf.

Each property runs twice: a default-budget test (``few_settings``: the references are costly) over
option combinations the op's own default tests already compile (compiled kernels are cached on disk,
so it costs run time only), and a ``@pytest.mark.slow`` twin with at least ``SLOW_EXAMPLES``
examples over every case of the op's tables. Profiles and replaying a failure: ``vmi_devkit.strategies``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vmi_core.formats import f32_from_bits
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cases import (
    norm_backward_cases,
    norm_forward_cases,
    pcc_cases,
    swiglu_backward_cases,
    swiglu_forward_cases,
)
from vmi_devkit.strategies import (
    SENTINEL,
    Guarded,
    assert_every_option_value_drawn,
    drawn_values,
    few_settings,
    float_matrix,
    guarded_like,
    hidden_sizes,
    load_profile,
    slow_settings,
    token_counts,
    with_row_padding,
)
from vmi_quant import (
    batched_transpose_weight_sf,
    get_token_alignment,
    norm_backward,
    norm_forward,
    norm_forward_and_per_token_cast,
    per_channel_cast,
    reference,
    reset_runtime_config,
    set_token_alignment,
    swiglu_backward,
    swiglu_backward_and_per_token_cast,
    swiglu_forward,
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_token_cast,
)
from vmi_quant.reference import swiglu_backward as reference_swiglu_backward
from vmi_quant.reference import swiglu_forward as reference_swiglu_forward
from vmi_quant.reference.cast import to_dtype

pytestmark = [pytest.mark.properties]

load_profile()

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
FLOAT_SPECIALS = [float("nan"), float("inf"), -float("inf")]


# --- building blocks -----------------------------------------------------------------------------------------------

def values(data, rows, cols, dtype=torch.float32, *, group=32, nonfinite=None, label="values"):
    """A drawn ``float_matrix`` (non-finite values drawn unless ``nonfinite`` is given)."""
    if nonfinite is None:
        nonfinite = data.draw(st.booleans(), label=f"{label} nonfinite")
    return float_matrix(data, rows, cols, dtype, nonfinite=nonfinite, group=group)


def with_values(data, x, choices, label, most=8):
    """``x`` with up to ``most`` drawn elements set to drawn values of ``choices`` (in place)."""
    if not x.numel() or not choices:
        return x
    n = data.draw(st.integers(0, most), label=f"{label} count")
    flat = x.view(-1)
    for _ in range(n):
        flat[data.draw(st.integers(0, x.numel() - 1), label=f"{label} position")] = \
            data.draw(st.sampled_from(choices), label=label)
    return x


def with_strides(data, x, label="x"):
    """``x`` (2-D or 3-D) or an equal view into a NaN-filled buffer with padded row (and batch) strides."""
    row_pad = data.draw(st.sampled_from([0, 0, 1, 16]), label=f"{label} row padding")
    batch_pad = data.draw(st.sampled_from([0, 3]), label=f"{label} batch padding") if x.dim() == 3 else 0
    if not row_pad and not batch_pad:
        return x
    shape = list(x.shape)
    shape[-1] += row_pad
    shape[-2] += batch_pad if x.dim() == 3 else 0
    wide = torch.full(shape, float("nan")).to(x.dtype)
    view = wide[..., :x.shape[-2], :x.shape[-1]]
    view.copy_(x)
    return view


def assert_untouched(guard: Guarded, name: str) -> None:
    """An output the op must ignore: not one byte of its buffer changed."""
    assert bool((guard.buffer == SENTINEL).all()), f"{name} was written"


def expert_layout(data, num_rows):
    """``(psum, valid)``: a drawn psum layout over ``num_rows`` rows at the token alignment it draws
    and sets, and which rows it gives an expert, by the layout's definition (expert ``e`` owns rows
    ``[align(psum[e-1], A), psum[e])``). Experts may be empty, end before their aligned start (own
    no row) or leave rows after the last one."""
    alignment = data.draw(st.sampled_from([1, 4, 8, 128]), label="token alignment")
    set_token_alignment(alignment)
    ends, valid, start = [], torch.zeros(num_rows, dtype=torch.bool), 0
    for _ in range(data.draw(st.integers(1, 6), label="experts")):
        end = ends[-1] if ends else 0
        if data.draw(st.booleans(), label="expert owns rows"):
            end = min(num_rows, max(end, start + data.draw(st.integers(0, 40), label="expert tokens")))
        valid[start:end] = True
        ends.append(end)
        start = -(-end // alignment) * alignment
    return torch.tensor(ends, dtype=torch.int32), valid


def row_weights(data, num_rows, nonfinite):
    return values(data, 1, num_rows, nonfinite=nonfinite, label="topk_weights")[0]


def scaling_factors() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([2.5, 1.0, -0.5]), st.floats(-1e3, 1e3, width=32))


def clamp_values() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.0, 0.5, 10.0]), st.floats(0, 100, width=32))


def swiglu_values(data, rows, hidden, dtype, clamp, *, nonfinite):
    """fp32 ``(rows, 2H)`` ``[gate | up]``: ``values`` with the clamp value and its negation, gates
    whose silu quotient is subnormal (1.5 * 2^-126) or that are subnormal (2^-130), whose ``exp(-a)``
    overflows (-100) or whose sigmoid is subnormal (-88), at drawn places."""
    x = values(data, rows, 2 * hidden, nonfinite=nonfinite, label="x")
    specials = [-100.0, -88.0, 1.5 * 2.0**-126, 2.0**-130, 1e4]
    if clamp is not None:
        specials += [clamp, -clamp]
    return with_values(data, x, specials, "swiglu special", most=12)


# --- per_channel_cast ----------------------------------------------------------------------------------------------

PCC_ALL = pcc_cases.COVERING + pcc_cases.FULL
PCC_DEFAULT = [pcc_cases.COVERING[0], pcc_cases.COVERING[4]]  # bf16 input; E4M3 input, packed SF in and out


def free_leading_stride(data, sf, col_major):
    """``sf`` or an equal copy whose leading stride (the row stride, or the column stride of a column-major
    SF) is larger; all-ones bytes in the gaps, so that a read of them shows."""
    pad = data.draw(st.sampled_from([0, 1, 5]), label="input sf leading-stride padding")
    if not pad or not sf.numel():
        return sf
    view = sf.T if col_major else sf
    rows, cols = view.shape
    storage = torch.full((rows, (cols + pad) * sf.element_size()), -1, dtype=torch.int8).view(sf.dtype)
    storage[:, :cols] = view
    return storage[:, :cols].T if col_major else storage[:, :cols]


def check_per_channel_cast(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    in_dtype, npc, in_sf, npt, out_sf, flavor = case
    options = pcc_cases.out_options(out_sf)
    tokens = data.draw(st.integers(0, 4), label="token tiles") * 128
    hidden = data.draw(hidden_sizes(128, 512), label="hidden")
    # Per-channel dynamic range and zero blocks along the tokens: a drawn (H, T) matrix, transposed.
    x = values(data, hidden, tokens, group=npt).T.contiguous()
    if in_dtype == "e4m3":
        q_data, q_sf = reference.cast(x, "e4m3", (1, npc), flavor=flavor, **pcc_cases.IN_SF[in_sf])
        x = (with_row_padding(data, q_data), free_leading_stride(data, q_sf, "col" in in_sf))
    else:
        x = with_row_padding(data, x.to(DTYPES[in_dtype]))
    ref_data, ref_sf = reference.cast(x, "e4m3", (npt, 1), x_block_size=None if npc is None else (1, npc),
                                      flavor=flavor, **options)
    got_data, got_sf = per_channel_cast(x, "e4m3", npt, num_per_channels=npc, target="cpu", flavor=flavor,
                                        **options)
    label = f"{pcc_cases.case_id(case)} shape={(tokens, hidden)}"
    assert_bitwise_equal(got_data, ref_data, f"data {label}")
    assert_bitwise_equal(got_sf, ref_sf, f"sf {label}")


@few_settings()
@given(st.data())
def test_per_channel_cast(data):
    check_per_channel_cast(data, PCC_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_channel_cast_slow(data):
    check_per_channel_cast(data, PCC_ALL)


# --- norm_forward ----------------------------------------------------------------------------------------------------

# (dtype, hidden, weight, residual, out_scale, flavor, eps)
NORM_ALL = [(*c, norm_forward_cases.EPS) for c in norm_forward_cases.NORM_CASES] + norm_forward_cases.NORM_FULL
NORM_DEFAULT = NORM_ALL[:2]


def norm_inputs(data, dtype, hidden, has_weight, has_residual, *, three_d_ok=True):
    """``(x, weight, residual)``: 2-D or 3-D, padded strides; non-finite values drawn."""
    tokens = data.draw(token_counts(), label="tokens")
    batch = data.draw(st.sampled_from([0, 1, 3]), label="batch (0: 2-D)") if three_d_ok else 0
    nonfinite = data.draw(st.booleans(), label="nonfinite")

    def matrix(label):
        m = values(data, max(batch, 1) * tokens, hidden, DTYPES[dtype], nonfinite=nonfinite, label=label)
        return with_strides(data, m.view(batch, tokens, hidden) if batch else m, label)

    weight = values(data, 1, hidden, DTYPES[dtype], nonfinite=nonfinite, label="weight")[0] if has_weight else None
    return matrix("x"), weight, matrix("residual") if has_residual else None


def check_norm_forward(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    dtype, hidden, has_weight, has_residual, out_scale, flavor, eps = case
    x, weight, residual = norm_inputs(data, dtype, hidden, has_weight, has_residual)
    ref_out, ref_rstd, ref_sum = reference.norm.norm_forward(x, weight, eps, residual, out_scale, flavor)
    g_out = guarded_like(data, ref_out, label="out")
    # Without a residual a given residual_out is ignored: it must stay untouched.
    g_sum = guarded_like(data, ref_out, label="residual_out")
    out, rstd, norm_input = norm_forward(x, weight, eps, residual, out_scale, None if g_out is None else g_out.tensor,
                                         None if g_sum is None else g_sum.tensor, target="cpu", flavor=flavor)
    label = f"{norm_forward_cases.case_id(case)} shape={tuple(x.shape)}"
    assert_bitwise_equal(out, ref_out, f"out {label}", check_stride=g_out is None)
    assert_bitwise_equal(rstd, ref_rstd, f"rstd {label}")
    if residual is None:
        assert norm_input is x, label
    else:
        assert_bitwise_equal(norm_input, ref_sum, f"residual_out {label}", check_stride=g_sum is None)
    if g_out is not None:
        assert out is g_out.tensor
        g_out.check("out")
    if g_sum is not None:
        if residual is None:
            assert_untouched(g_sum, "residual_out without residual")
        else:
            assert norm_input is g_sum.tensor
            g_sum.check("residual_out")


@few_settings()
@given(st.data())
def test_norm_forward(data):
    check_norm_forward(data, NORM_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_norm_forward_slow(data):
    check_norm_forward(data, NORM_ALL)


# --- norm_forward_and_per_token_cast -------------------------------------------------------------------------------

# (dtype, hidden, weight, residual, out_scale, flavor, col_major, round_sf, packed, with_out_bf16, mega_block_m, eps)
NORM_CAST_ALL = [(*c, norm_forward_cases.EPS) for c in norm_forward_cases.CAST_CASES] + norm_forward_cases.CAST_FULL
NORM_CAST_DEFAULT = [NORM_CAST_ALL[0], NORM_CAST_ALL[2]]  # packed column-major SF; Mega MoE SF


def mega_window(tokens, hidden, block_m, extra_rows):
    """A sentinel-guarded M-major Mega MoE window (every row of each word column) and the ``(T, H / 128)``
    view of it the op takes."""
    rows = -(-tokens // block_m) * (-(-block_m // 128) * 128) + extra_rows
    guard = Guarded((rows, hidden // 128), (1, rows), torch.int32)
    return guard, guard.tensor[:tokens]


def with_pad_bytes(sf, groups, byte):
    """A packed SF with the bytes past ``groups`` in each row (unused bytes of the last word) set to ``byte``."""
    if sf.dtype == torch.float32 or not sf.numel():
        return sf
    raw = sf.contiguous().view(torch.uint8).view(*sf.shape[:-1], -1).clone()
    raw[..., groups:] = byte
    return raw.view(sf.dtype)


def check_norm_forward_and_per_token_cast(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    dtype, hidden, has_weight, has_residual, out_scale, flavor, col_major, round_sf, packed, with_bf16, block_m, eps \
        = case
    x, weight, residual = norm_inputs(data, dtype, hidden, has_weight, has_residual, three_d_ok=not block_m)
    options = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed,
                   with_out_bf16=with_bf16, mega_moe_block_m=block_m)
    extra_rows = data.draw(st.integers(0, 3), label="mega rows past the last block")
    ref_mega = got_mega = mega = None
    if block_m:
        ref_mega, _ = mega_window(x.shape[0], hidden, block_m, extra_rows)
        got_mega, mega = mega_window(x.shape[0], hidden, block_m, extra_rows)
    (ref_data, ref_sf), ref_bf16, ref_rstd, ref_sum = norm_forward_and_per_token_cast(
        x, weight, eps, "e4m3", 32, residual, out_scale, **options,
        mega_moe_sf=None if ref_mega is None else ref_mega.tensor[:x.shape[0]], target="torch", flavor=flavor)
    g_data = guarded_like(data, ref_data, label="out data")
    # A given SF is row-major; the unused bytes of its packed words are not written.
    g_sf = None if col_major else guarded_like(data, ref_sf, label="out sf")
    g_bf16 = guarded_like(data, ref_bf16, label="out_bf16") if with_bf16 else None
    g_sum = guarded_like(data, torch.empty(x.shape, dtype=x.dtype), label="residual_out")
    out = None
    if g_data is not None or g_sf is not None:
        out = (None if g_data is None else g_data.tensor, None if g_sf is None else g_sf.tensor)
    (data_q, sf), out_bf16, rstd, norm_input = norm_forward_and_per_token_cast(
        x, weight, eps, "e4m3", 32, residual, out_scale, **options, out=out,
        out_bf16=None if g_bf16 is None else g_bf16.tensor, residual_out=None if g_sum is None else g_sum.tensor,
        mega_moe_sf=mega, target="cpu", flavor=flavor)
    label = f"{norm_forward_cases.case_id(case)} shape={tuple(x.shape)}"
    assert_bitwise_equal(data_q, ref_data, f"data {label}", check_stride=g_data is None)
    if g_sf is None:
        assert_bitwise_equal(sf, ref_sf, f"sf {label}")
    else:
        assert sf is g_sf.tensor
        assert_bitwise_equal(sf, with_pad_bytes(ref_sf, hidden // 32, SENTINEL), f"given sf {label}",
                             check_stride=False)
    assert_bitwise_equal(rstd, ref_rstd, f"rstd {label}")
    if with_bf16:
        assert_bitwise_equal(out_bf16, ref_bf16, f"out_bf16 {label}", check_stride=g_bf16 is None)
    else:
        assert out_bf16 is None, label
    if residual is None:
        assert norm_input is x, label
    else:
        assert_bitwise_equal(norm_input, ref_sum, f"residual_out {label}", check_stride=g_sum is None)
    if block_m:
        assert_bitwise_equal(got_mega.tensor, ref_mega.tensor, f"mega_moe_sf {label}")
        got_mega.check("mega_moe_sf")
    for guard, name in ((g_data, "out data"), (g_sf, "out sf"), (g_bf16, "out_bf16")):
        if guard is not None:
            guard.check(name)
    if g_sum is not None:
        if residual is None:
            assert_untouched(g_sum, "residual_out without residual")
        else:
            g_sum.check("residual_out")


@few_settings()
@given(st.data())
def test_norm_forward_and_per_token_cast(data):
    check_norm_forward_and_per_token_cast(data, NORM_CAST_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_norm_forward_and_per_token_cast_slow(data):
    check_norm_forward_and_per_token_cast(data, NORM_CAST_ALL)


# --- norm_backward -------------------------------------------------------------------------------------------------

NORM_BACKWARD_ALL = norm_backward_cases.COVERING + norm_backward_cases.FULL + norm_backward_cases.MORE
NORM_BACKWARD_DEFAULT = [norm_backward_cases.COVERING[0], norm_backward_cases.COVERING[2]]


def check_norm_backward(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    dtype, hidden, weight_grad, has_residual, out_scale, flavor = case
    tokens = data.draw(token_counts(), label="tokens")
    nonfinite = data.draw(st.booleans(), label="nonfinite")

    def matrix(label):
        return with_strides(data, values(data, tokens, hidden, DTYPES[dtype], nonfinite=nonfinite, label=label),
                            label)

    x, out_grad = matrix("x"), matrix("out_grad")
    residual_out_grad = matrix("residual_out_grad") if has_residual else None
    weight = None if weight_grad is None else values(data, 1, hidden, DTYPES[dtype], nonfinite=nonfinite,
                                                     label="weight")[0]
    # The forward's rstd, with drawn special values (an infinite rstd, a zero one, ...).
    rstd = torch.rsqrt(x.double().square().mean(-1) + norm_backward_cases.EPS).float()
    with_values(data, rstd, ([float("inf"), float("nan")] if nonfinite else []) + [0.0, 2.0**-149, 1e30], "rstd",
                most=3)
    buffer = None
    if weight_grad in DTYPES:
        buffer = Guarded((hidden,), (1,), DTYPES[weight_grad])
        buffer.tensor.copy_(values(data, 1, hidden, DTYPES[weight_grad], nonfinite=nonfinite, label="weight_grad")[0])
    ref_x_grad, ref_weight_grad = reference.norm_backward(
        out_grad, x, weight, rstd, residual_out_grad, out_scale, None if buffer is None else buffer.tensor.clone(),
        flavor=flavor)
    x_grad, got_weight_grad = norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale,
                                            None if buffer is None else buffer.tensor, target="cpu", flavor=flavor)
    # NaN payloads are unspecified (docs/quant/norm_backward.md): NaN positions and every other bit.
    label = f"{norm_backward_cases.case_id(case)} T={tokens}"
    assert_bitwise_equal(x_grad, ref_x_grad, f"x_grad {label}", any_nan=True)
    if weight is None:
        assert got_weight_grad is None, label
        return
    assert_bitwise_equal(got_weight_grad, ref_weight_grad, f"weight_grad {label}", any_nan=True)
    if buffer is not None:
        assert got_weight_grad is buffer.tensor, label
        buffer.check("weight_grad")


@few_settings()
@given(st.data())
def test_norm_backward(data):
    check_norm_backward(data, NORM_BACKWARD_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_norm_backward_slow(data):
    check_norm_backward(data, NORM_BACKWARD_ALL)


# --- swiglu_forward and swiglu_forward_and_per_token_cast ----------------------------------------------------------

SWIGLU_FORWARD_ALL = list(dict.fromkeys(swiglu_forward_cases.COVERING + swiglu_forward_cases.FULL))
SWIGLU_FORWARD_DEFAULT = swiglu_forward_cases.COVERING[:2]  # bf16 output; E4M3 with a packed column-major SF


def check_swiglu_forward(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    in_dtype, fmt, npc, sf_mode, with_psum, weights, with_clamp, count, flavor = case
    rows = data.draw(token_counts(), label="rows")
    hidden = data.draw(hidden_sizes(max(64, npc or 0), 640), label="hidden")
    clamp = data.draw(clamp_values(), label="clamp_value") if with_clamp is not None else None
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    try:
        psum, valid = expert_layout(data, rows) if with_psum else (None, torch.ones(rows, dtype=torch.bool))
        x = swiglu_values(data, rows, hidden, DTYPES[in_dtype], clamp, nonfinite=nonfinite)
        topk = row_weights(data, rows, nonfinite) if weights != "none" else None
        # Padding rows are not read: garbage there.
        x[~valid] = data.draw(st.sampled_from(FLOAT_SPECIALS + [1e30]), label="padding value")
        if topk is not None:
            topk[~valid] = 7.0
        x = with_row_padding(data, x.to(DTYPES[in_dtype]))
        rsf = data.draw(scaling_factors(), label="routed_scaling_factor") if weights == "w+rsf" else None
        start = data.draw(st.lists(st.integers(0, 2**40), min_size=4, max_size=4), label="counter start")
        counter = torch.tensor(start, dtype=torch.int64) if count else None
        alignment = get_token_alignment()
        label = f"{swiglu_forward_cases.case_id(case)} {fmt} {flavor} shape={(rows, hidden)} psum={psum} c={clamp}"
        if fmt == "e4m3":
            col_major, round_sf, packed = swiglu_forward_cases.SF_MODES[sf_mode]
            (ref_data, ref_sf), ref_valid, counts = reference_swiglu_forward.swiglu_forward_and_per_token_cast(
                x, npc, psum, topk, rsf, col_major, round_sf, packed, clamp, alignment, flavor)
            # Padding rows are zeros: data +0, SF bytes 0.
            ref_data.view(torch.uint8)[~valid] = 0
            ref_sf[~valid] = 0
            got_data, got_sf = swiglu_forward_and_per_token_cast(
                x, "e4m3", npc, psum, topk, rsf, col_major, round_sf, packed, clamp, counter, target="cpu",
                flavor=flavor)
            assert_bitwise_equal(got_data, ref_data, f"data {label}")
            assert_bitwise_equal(got_sf, ref_sf, f"sf {label}")
        else:
            y, ref_valid, counts = reference_swiglu_forward.swiglu_forward(x, psum, topk, rsf, clamp, alignment, flavor)
            expected = torch.where(valid[:, None], to_dtype(y, DTYPES[fmt]), torch.zeros((), dtype=DTYPES[fmt]))
            if data.draw(st.booleans(), label="as swiglu_forward_and_per_token_cast"):
                got = swiglu_forward_and_per_token_cast(x, fmt, None, psum, topk, rsf, clamp_value=clamp,
                                                        clamped_count=counter, target="cpu", flavor=flavor)
            else:
                got = swiglu_forward(x, fmt, psum, topk, rsf, clamp, counter, target="cpu", flavor=flavor)
            assert_bitwise_equal(got, expected, f"out {label}")
        assert torch.equal(ref_valid, valid), f"the reference's expert rows {label}"
        if counter is not None:
            assert counter.tolist() == (torch.tensor(start) + counts).tolist(), label
    finally:
        reset_runtime_config()


@few_settings()
@given(st.data())
def test_swiglu_forward(data):
    check_swiglu_forward(data, SWIGLU_FORWARD_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_swiglu_forward_slow(data):
    check_swiglu_forward(data, SWIGLU_FORWARD_ALL)


# --- swiglu_forward_and_per_channel_cast_and_transpose -------------------------------------------------------------

SWIGLU_PER_CHANNEL_ALL = [swiglu_forward_cases.PER_CHANNEL_DEFAULT] + swiglu_forward_cases.PER_CHANNEL_FULL


def check_swiglu_per_channel(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    npt, round_sf, without_transpose, with_clamp, flavor = case
    tokens = data.draw(st.integers(0, 3), label="token tiles") * 128
    hidden = data.draw(hidden_sizes(64, 448), label="hidden")
    clamp = data.draw(clamp_values(), label="swiglu_clamp_value") if with_clamp is not None else None
    # Zero blocks of a channel's tokens: a drawn (2H, T) matrix, transposed.
    x = values(data, 2 * hidden, tokens, group=npt).T.contiguous()
    x = with_values(data, x, [-100.0, 1.5 * 2.0**-126, 2.0**-130] + ([] if clamp is None else [clamp, -clamp]),
                    "swiglu special")
    x = with_row_padding(data, x.to(torch.bfloat16))
    ref_data, ref_sf = reference_swiglu_forward.swiglu_forward_and_per_channel_cast_and_transpose(
        x, npt, round_sf, without_transpose, clamp, flavor)
    got_data, got_sf = swiglu_forward_and_per_channel_cast_and_transpose(
        x, "e4m3", npt, round_sf, without_transpose, clamp, target="cpu", flavor=flavor)
    label = f"{case} shape={(tokens, hidden)} c={clamp}"
    assert_bitwise_equal(got_data, ref_data, f"data {label}")
    assert_bitwise_equal(got_sf, ref_sf, f"sf {label}")


@few_settings()
@given(st.data())
def test_swiglu_forward_and_per_channel_cast_and_transpose(data):
    check_swiglu_per_channel(data, [swiglu_forward_cases.PER_CHANNEL_DEFAULT])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_swiglu_forward_and_per_channel_cast_and_transpose_slow(data):
    check_swiglu_per_channel(data, SWIGLU_PER_CHANNEL_ALL)


# --- swiglu_backward and swiglu_backward_and_per_token_cast --------------------------------------------------------

# (case, fmt): the plain path's output format (``fmt``) need not be x's dtype; the E4M3 path's is "e4m3".
SWIGLU_BACKWARD_ALL = [(case, fmt) for case in swiglu_backward_cases.COVERING + swiglu_backward_cases.FULL
                       + swiglu_backward_cases.MORE for fmt in (DTYPES if case[2] is None else ("e4m3",))]
SWIGLU_BACKWARD_DEFAULT = [(swiglu_backward_cases.COVERING[0], "bf16"), (swiglu_backward_cases.COVERING[3], "e4m3")]


def check_swiglu_backward(data, cases):
    case, fmt = data.draw(st.sampled_from(cases), label="case")
    in_fmt, grad_fmt, npc, layout, flavor, weights, _, with_clamp, recompute, with_psum, hidden = case
    batch = data.draw(st.sampled_from([0, 2]), label="batch (0: 2-D)")
    rows = data.draw(token_counts(70), label="rows per batch") * max(batch, 1)
    clamp = data.draw(clamp_values(), label="clamp_value") if with_clamp is not None else None
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    try:
        psum, valid = expert_layout(data, rows) if with_psum else (None, torch.ones(rows, dtype=torch.bool))
        gate_up = swiglu_values(data, rows, hidden, torch.float32, clamp, nonfinite=nonfinite)
        if clamp is not None:
            # The clamp of a NaN input is unspecified (docs/quant/swiglu_backward.md).
            gate_up = torch.where(gate_up.isnan(), float("inf"), gate_up)
            if npc is not None:  # and an infinite input scale dequantizes a zero code to NaN
                gate_up = torch.where(gate_up.isinf(), 1e30, gate_up)
        gate_up[~valid] = data.draw(st.sampled_from(FLOAT_SPECIALS + [1e30]), label="padding value")
        grad = values(data, rows, hidden, DTYPES[grad_fmt], nonfinite=nonfinite, label="act_x_grad")
        grad[~valid] = float("nan")
        topk = row_weights(data, rows, nonfinite) if weights else None
        if topk is not None:
            topk[~valid] = 7.0
        rsf = data.draw(st.one_of(st.none(), scaling_factors()), label="routed_scaling_factor") if weights else None
        if npc is None:
            x = gate_up.to(DTYPES[in_fmt])
        else:
            x = reference.cast(gate_up, "e4m3", (1, npc), round_sf=data.draw(st.booleans(), label="input round_sf"))
            x[0].view(torch.uint8)[~valid] = 0x7F
        a, b = reference_swiglu_backward.dequantize_halves(x, npc)
        d_a, d_b, act_out, weight_grad = reference_swiglu_backward.swiglu_backward(
            a, b, grad, valid, topk, rsf, clamp, flavor)
        full = torch.cat([d_a, d_b], dim=1)
        out_dtype = torch.bfloat16 if npc is not None else DTYPES[fmt]
        expected = [to_dtype(full, out_dtype)]
        options = dict(psum_num_tokens_per_expert=psum, topk_weights=topk, routed_scaling_factor=rsf,
                       clamp_value=clamp, do_recompute=recompute, target="cpu", flavor=flavor)
        if npc is not None:
            sf_options = swiglu_backward_cases.SF_OPTIONS[layout]
            expected.append(reference_swiglu_backward.quantize_grad(full, valid, npc, flavor=flavor, **sf_options))
        if weights:
            expected.append(weight_grad)
        if recompute:
            expected.append(to_dtype(act_out, out_dtype))
        if batch:
            x = (x[0].view(batch, -1, x[0].shape[1]), x[1]) if npc is not None else x.view(batch, -1, x.shape[1])
            grad = grad.view(batch, -1, hidden)
        else:
            x = (with_row_padding(data, x[0]), x[1]) if npc is not None else with_row_padding(data, x)
            grad = with_row_padding(data, grad)
        if npc is None:
            got = swiglu_backward(x, grad, fmt, **options)
        else:
            got = swiglu_backward_and_per_token_cast(x, grad, "e4m3", npc, **options, **sf_options)
    finally:
        reset_runtime_config()
    label = f"{swiglu_backward_cases.case_id(case)} fmt={fmt} rows={rows} batch={batch} psum={psum} c={clamp} rsf={rsf}"
    assert len(got) == len(expected), label
    for k, (result, want) in enumerate(zip(got, expected, strict=True)):
        if isinstance(want, tuple):  # the E4M3 gradient: the family's canonical NaN rules, bit for bit
            assert_bitwise_equal(result[0], want[0], f"x_grad_fp8 {label}")
            assert_bitwise_equal(result[1], want[1], f"x_grad_fp8_sf {label}")
        else:  # NaN sign and payload unspecified
            assert_bitwise_equal(result, want, f"output {k} {label}", any_nan=True)


@few_settings()
@given(st.data())
def test_swiglu_backward(data):
    check_swiglu_backward(data, SWIGLU_BACKWARD_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_swiglu_backward_slow(data):
    check_swiglu_backward(data, SWIGLU_BACKWARD_ALL)


# --- batched_transpose_weight_sf -----------------------------------------------------------------------------------

# (block_size, flavor): the kernels the default run of test_batched_transpose_weight_sf compiles,
# then the other two.
TRANSPOSE_DEFAULT = [(32, "ascend"), (128, "cuda")]
TRANSPOSE_ALL = TRANSPOSE_DEFAULT + [(128, "ascend"), (32, "cuda")]
# Not +0 or a finite positive power of two: a mantissa, a sign (-0.0 too), a subnormal, inf, NaN.
BAD_SCALES = [3.0, -2.0, -0.0, 2.0**-130, float("inf"), float("nan")]


def weight_shapes(data, block_size):
    """``(scale shape, transpose_sf1)`` per weight: 0 to 3 weights, 2-D or grouped, n and k multiples of 128."""
    shapes = []
    for _ in range(data.draw(st.integers(0, 3), label="weights")):
        n, k = (data.draw(st.integers(1, 5), label="n, k / 128") * 128 // block_size for _ in range(2))
        groups = data.draw(st.sampled_from([None, 1, 3]), label="groups")
        shapes.append(((n, k) if groups is None else (groups, n, k), data.draw(st.booleans(), label="transpose")))
    return shapes


def power_of_two_scales(data, shape):
    """+0 and positive powers of two (exponent bytes 1..254 and the extremes), from a drawn seed."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    exponents = torch.randint(1, 255, shape, generator=g)
    exponents[torch.rand(shape, generator=g) < 0.1] = 0
    sf = f32_from_bits(exponents << 23)
    return with_values(data, sf, [0.0, 2.0**-126, 2.0**127], "extreme scale", most=3)


def fresh_outputs(expected):
    """Sentinel-guarded outputs laid out as the op returns them (its ``outs`` must match exactly)."""
    return tuple(Guarded(tuple(t.shape), tuple(t.stride()), t.dtype) for t in expected)


def compare_transposed(got, expected, label):
    assert len(got) == len(expected), label
    for i, (pair, want) in enumerate(zip(got, expected, strict=True)):
        for name, out, ref in zip(("sf0", "sf1"), pair, want, strict=True):
            assert out.data_ptr() % 32 == 0, f"{name} of weight {i} is not 32-byte aligned [{label}]"
            assert_bitwise_equal(out, ref, f"{name} of weight {i} [{label}]")


def check_batched_transpose_weight_sf(data, cases):
    block_size, flavor = data.draw(st.sampled_from(cases), label="case")
    shapes = weight_shapes(data, block_size)
    transposes = [t for _, t in shapes]
    label = f"bs={block_size} {flavor} weights={shapes}"
    sf = [power_of_two_scales(data, shape) for shape, _ in shapes]
    first = batched_transpose_weight_sf(sf, block_size, transposes, target="cpu", flavor=flavor)
    compare_transposed(first, reference.batched_transpose_weight_sf(sf, block_size, transposes, flavor=flavor),
                       f"round 1 {label}")
    # Round 2: new scales, each weight's outputs new, the first round's, or given guarded tensors.
    sf = [power_of_two_scales(data, shape) for shape, _ in shapes]
    reuse = [data.draw(st.sampled_from(["new", "returned", "given"]), label="outs") for _ in shapes]
    guards = [fresh_outputs(pair) if how == "given" else None for pair, how in zip(first, reuse, strict=True)]
    outs = [None if how == "new" else pair if how == "returned" else (g[0].tensor, g[1].tensor)
            for pair, how, g in zip(first, reuse, guards, strict=True)]
    bad = data.draw(st.sampled_from([None, *range(len(shapes))]), label="weight with a bad scale")
    if bad is not None:
        sf[bad].view(-1)[data.draw(st.integers(0, sf[bad].numel() - 1), label="bad scale position")] = \
            data.draw(st.sampled_from(BAD_SCALES), label="bad scale")
    before = [t.clone() for pair in outs if pair is not None for t in pair]
    if bad is not None:
        with pytest.raises(ValueError, match=rf"sf\[{bad}\]"):
            reference.batched_transpose_weight_sf(sf, block_size, transposes, flavor=flavor)
        with pytest.raises(ValueError, match=rf"sf\[{bad}\] must hold \+0 or positive powers of two"):
            batched_transpose_weight_sf(sf, block_size, transposes, outs, target="cpu", flavor=flavor)
        after = [t for pair in outs if pair is not None for t in pair]
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            assert_bitwise_equal(new, old, f"given output {i} after the error [{label}]")
    else:
        second = batched_transpose_weight_sf(sf, block_size, transposes, outs, target="cpu", flavor=flavor)
        compare_transposed(second, reference.batched_transpose_weight_sf(sf, block_size, transposes, flavor=flavor),
                           f"round 2 {label} outs={reuse}")
        for got, given in zip(second, outs, strict=True):
            if given is not None:
                assert got[0] is given[0] and got[1] is given[1], label
    for g in guards:
        if g is not None:
            g[0].check("given sf0")
            g[1].check("given sf1")


@few_settings()
@given(st.data())
def test_batched_transpose_weight_sf(data):
    check_batched_transpose_weight_sf(data, TRANSPOSE_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_batched_transpose_weight_sf_slow(data):
    check_batched_transpose_weight_sf(data, TRANSPOSE_ALL)


# --- what the slow twins draw ---------------------------------------------------------------------------------------

def _sf_layout(layout: str, option: str) -> bool:
    return swiglu_backward_cases.SF_OPTIONS[layout].get(option, False)


_SWIGLU_FORWARD_PLAIN = [c for c in SWIGLU_FORWARD_ALL if c[1] != "e4m3"]
_SWIGLU_FORWARD_E4M3 = [c for c in SWIGLU_FORWARD_ALL if c[1] == "e4m3"]
_SWIGLU_BACKWARD_PLAIN = [(c, fmt) for c, fmt in SWIGLU_BACKWARD_ALL if fmt != "e4m3"]
_SWIGLU_BACKWARD_E4M3 = [c for c, fmt in SWIGLU_BACKWARD_ALL if fmt == "e4m3"]
_SWIGLU_BACKWARD_EXPERT_PATH = dict(weights=lambda c: c[5], clamp=lambda c: c[7] is not None,
                                    do_recompute=lambda c: c[8], psum=lambda c: c[9])

# Per op, the values of each option ``vmi run OP -o name=value`` documents that the slow twins draw
# (from the case tables they sample); a documented value no twin draws fails the test below.
DRAWN = {
    "per_channel_cast": drawn_values(
        PCC_ALL, in_dtype=lambda c: c[0], num_per_channels=lambda c: c[1], num_per_tokens=lambda c: c[3],
        round_sf=lambda c: pcc_cases.OUT_SF[c[4]][0], use_packed_ue8m0=lambda c: pcc_cases.OUT_SF[c[4]][1]),
    "norm_forward": drawn_values(NORM_ALL, in_dtype=lambda c: c[0], use_weight=lambda c: c[2],
                                 use_residual=lambda c: c[3]),
    "norm_forward_and_per_token_cast": drawn_values(
        NORM_CAST_ALL, in_dtype=lambda c: c[0], use_weight=lambda c: c[2], use_residual=lambda c: c[3],
        use_tma_aligned_col_major_sf=lambda c: c[6], round_sf=lambda c: c[7], use_packed_ue8m0=lambda c: c[8],
        with_out_bf16=lambda c: c[9]),
    "norm_backward": drawn_values(NORM_BACKWARD_ALL, in_dtype=lambda c: c[0], weight_grad_dtype=lambda c: c[2],
                                  with_residual_grad=lambda c: c[3], scaled=lambda c: c[4] != 1.0),
    "swiglu_forward": drawn_values(_SWIGLU_FORWARD_PLAIN, fmt=lambda c: c[1], in_dtype=lambda c: c[0],
                                   weights=lambda c: c[5] != "none", clamp=lambda c: c[6] is not None),
    "swiglu_forward_and_per_token_cast": drawn_values(
        _SWIGLU_FORWARD_E4M3, num_per_channels=lambda c: c[2], in_dtype=lambda c: c[0],
        weights=lambda c: c[5] != "none", clamp=lambda c: c[6] is not None,
        use_tma_aligned_col_major_sf=lambda c: swiglu_forward_cases.SF_MODES[c[3]][0],
        round_sf=lambda c: swiglu_forward_cases.SF_MODES[c[3]][1],
        use_packed_ue8m0=lambda c: swiglu_forward_cases.SF_MODES[c[3]][2]),
    "swiglu_forward_and_per_channel_cast_and_transpose": drawn_values(
        SWIGLU_PER_CHANNEL_ALL, num_per_tokens=lambda c: c[0], round_sf=lambda c: c[1],
        without_transpose=lambda c: c[2], clamp=lambda c: c[3] is not None),
    "swiglu_backward": {
        **drawn_values([c for c, _ in _SWIGLU_BACKWARD_PLAIN], **_SWIGLU_BACKWARD_EXPERT_PATH),
        "fmt": {fmt for _, fmt in _SWIGLU_BACKWARD_PLAIN},
    },
    "swiglu_backward_and_per_token_cast": drawn_values(
        _SWIGLU_BACKWARD_E4M3, num_per_channels=lambda c: c[2], **_SWIGLU_BACKWARD_EXPERT_PATH,
        round_sf=lambda c: _sf_layout(c[3], "round_sf"),
        use_packed_ue8m0=lambda c: _sf_layout(c[3], "use_packed_ue8m0"),
        use_tma_aligned_col_major_sf=lambda c: _sf_layout(c[3], "use_tma_aligned_col_major_sf")),
    # transpose_sf1 is drawn per weight (weight_shapes).
    "batched_transpose_weight_sf": {**drawn_values(TRANSPOSE_ALL, block_size=lambda c: c[0]),
                                    "transpose_sf1": {False, True}},
}


def test_the_slow_twins_draw_every_documented_option_value():
    assert_every_option_value_drawn(DRAWN)
