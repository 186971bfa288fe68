"""swiglu_forward and swiglu_forward_and_per_token_cast on the cpu and ascend-sim targets, bit for
bit against the torch reference ``reference.swiglu_forward`` (spec quant-b §6, §0.5).

Each option combination is one compiled kernel (row count, hidden size, the expert layout and the
clamp and scaling values are runtime values); the default matrix is a covering set, the full
product runs under ``slow``. Outputs are compared on the valid rows of the expert layout (the op
kernel leaves the others unwritten, which ``test_rows_outside_experts`` checks; the op then zeros
them in the outputs it allocates), counters as exact integers added to a non-zero start.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, randn, sim_schedule
from vmi_devkit.cases.swiglu_forward_cases import COVERING, FULL, SF_MODES, SIM_COVERING, SIM_FULL, case_id
from vmi_devkit.errors import forbid_kernels
from vmi_quant.config import get_token_alignment, set_token_alignment
from vmi_quant.inputs import expert_rows
from vmi_quant.kernels.swiglu_forward import launch
from vmi_quant.ops.swiglu_forward import (
    _prepare,
    swiglu_forward,
    swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_parallel,
    swiglu_forward_parallel,
)
from vmi_quant.reference import swiglu_forward as reference
from vmi_quant.reference.cast import to_dtype
from vmi_quant.sf_layout import align

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ALIGNMENT = 8
RSF = 2.5
# (rows, hidden): no rows; one row; 37 rows with a partial second 512-channel tile (H 640); one
# tile of 128 channels (four groups of 32, one of 128).
SHAPES = [(0, 384), (1, 640), (37, 640), (21, 128)]
# ascend-sim (64 cores): 9 rows x 2 tiles (most cores idle), 70 rows x 1 tile (some cores run two),
# 129 and 193 rows x 1 tile (core 0 runs 3 and 4 tiles: more than its buffer versions), the last
# two under consumers_first and producers_first for the default run's case (the shapes cycle
# through the pipe schedules), so a missing wait between pipes shows up.
SIM_SHAPES = [(9, 640), (70, 128), (129, 128), (193, 128)]
COUNTER_START = (5, 0, 7, 1)


@pytest.fixture(autouse=True)
def token_alignment():
    previous = get_token_alignment()
    set_token_alignment(ALIGNMENT)
    yield
    set_token_alignment(previous)


def _psum(num_rows: int, seed: int) -> torch.Tensor:
    """An expert layout over ``num_rows`` rows: up to 5 experts of 0-11 tokens, each padded to the
    token alignment, the last one cut at ``num_rows`` (rows past the last expert stay padding)."""
    counts = torch.randint(0, 12, (5,), generator=generator(seed)).tolist()
    psum, start = [], 0
    for count in counts:
        if start > num_rows:
            break
        end = min(start + count, num_rows)
        psum.append(end)
        start = align(end, ALIGNMENT)
    return torch.tensor(psum, dtype=torch.int32)


def _values(shape, seed, dtype):
    """``(N, 2H)`` inputs around the clamp values, with clamp ties (0.5, -0.5), gates whose silu
    quotient is subnormal (1.5 * 2^-126) or that are subnormal themselves (2^-130), gates whose
    ``exp(-a)`` overflows (-100) and huge gates; in row 0 of two or more, NaN: a -inf gate
    (``-inf / inf``) and a negative NaN gate (bf16 ``0xFFFF``, which torch's own bf16 conversion
    also writes for a NaN): every NaN written must be the canonical +NaN."""
    rows, hidden = shape
    x = randn((rows, 2 * hidden), seed) * 2
    if rows:
        x[:, 0] = 0.5
        x[:, hidden] = -0.5
        x[:, 1] = -100.0
        x[:, 2] = 2.0 ** -130
        x[:, 3] = 1e4
        x[:, 4] = 1.5 * 2.0 ** -126
        x[:, hidden + 3] = -3.0
    if rows > 1:
        x[0, 5] = -float("inf")
        x[0, 6] = torch.tensor(-1, dtype=torch.int32).view(torch.float32)
    return x.to(dtype)


def _arguments(case, shape, seed):
    in_dtype, fmt, npc, sf_mode, with_psum, weights, clamp, count, flavor = case
    x = _values(shape, seed, DTYPES[in_dtype])
    psum = _psum(shape[0], seed) if with_psum else None
    topk = randn((shape[0],), seed + 100) if weights != "none" else None
    rsf = RSF if weights == "w+rsf" else None
    counter = torch.tensor(COUNTER_START, dtype=torch.int64) if count else None
    return x, psum, topk, rsf, clamp, counter


SENTINEL = 0xA5


def _run(case, x, psum, topk, rsf, clamp, counter, target, flavor):
    """The op's kernel (``target``) or reference run on outputs pre-filled with a sentinel byte;
    rows outside the expert layout must keep it (in the data and in every byte of the SF)."""
    in_dtype, fmt, npc, sf_mode, *_ = case
    col_major, round_sf, packed = SF_MODES[sf_mode] if fmt == "e4m3" else (False, False, False)
    _, call = _prepare(x, fmt, npc, psum, topk, rsf, col_major, round_sf, packed, clamp, counter, target, flavor)
    outputs = [call.out] if call.sf is None else [call.out, call.sf]
    for t in outputs:
        (t.T if col_major and t is call.sf else t).view(torch.uint8).fill_(SENTINEL)
    launch(call, target)
    padding = ~reference_rows(psum, x.shape[0])
    for t in outputs:
        assert (t[padding].contiguous().view(torch.uint8) == SENTINEL).all(), "a row outside the experts was written"
    return outputs


def reference_rows(psum, num_rows):
    if psum is None:
        return torch.ones(num_rows, dtype=torch.bool)
    return expert_rows(psum, num_rows, get_token_alignment())


def _used_bytes(words: torch.Tensor, npc: int, hidden: int) -> torch.Tensor:
    """Packed UE8M0 words (int64) with the bytes past the last group cleared."""
    pack = words.element_size()  # exponent bytes per word
    used = (hidden // npc - torch.arange(words.shape[1]) * pack).clamp(0, pack)
    return words.to(torch.int64) & ((1 << (8 * used)) - 1)


def _check_case(case, shapes=SHAPES, *, target="cpu", offset=0):
    in_dtype, fmt, npc, sf_mode, with_psum, weights, clamp, count, flavor = case
    for seed, shape in enumerate(shapes):
        x, psum, topk, rsf, clamp, counter = _arguments(case, shape, seed)
        schedule = SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]
        label = f"{case_id(case)} shape={shape} target={target} schedule={schedule}"
        y, valid, counts = reference.swiglu_forward(x, psum, topk, rsf, clamp, ALIGNMENT, flavor)
        with sim_schedule(schedule):
            outputs = _run(case, x, psum, topk, rsf, clamp, counter, target,
                           None if target == "ascend-sim" else flavor)
        if fmt == "e4m3":
            col_major, round_sf, packed = SF_MODES[sf_mode]
            data, sf = outputs
            (ref_data, ref_sf), _, _ = reference.swiglu_forward_and_per_token_cast(
                x, npc, psum, topk, rsf, col_major, round_sf, packed, clamp, ALIGNMENT, flavor)
            assert data.dtype == ref_data.dtype and data.shape == ref_data.shape, label
            assert sf.dtype == ref_sf.dtype and sf.shape == ref_sf.shape, label
            # (An empty column-major view's leading stride is arbitrary.)
            assert sf.stride() == ref_sf.stride() or not sf.numel(), label
            assert_bitwise_equal(data[valid], ref_data[valid], f"data [{label}]")
            if packed:
                # Pad bytes of the last packed word are unspecified (the op leaves them as they were).
                sf, ref_sf = _used_bytes(sf, npc, shape[1]), _used_bytes(ref_sf, npc, shape[1])
            assert_bitwise_equal(sf[valid], ref_sf[valid], f"sf [{label}]")
        else:
            (out,) = outputs
            assert out.shape == y.shape and out.is_contiguous(), label
            assert_bitwise_equal(out[valid], to_dtype(y[valid], DTYPES[fmt]), f"out [{label}]")
        if counter is not None:
            assert counter.tolist() == (torch.tensor(COUNTER_START) + counts).tolist(), label


def _assert_padding_zero(outputs, valid, label):
    """The op allocates its outputs: rows outside the expert layout are zero bytes."""
    for t in outputs:
        assert (t[~valid].contiguous().view(torch.uint8) == 0).all(), f"{label}: a padding row is not zero"


def _check_entry_points(case):
    """The torch target, the Python function's plain form and the ``_parallel`` entries against the
    reference, with the kernel of ``case`` (COVERING[0]: bf16 output, [1]: E4M3). Deterministic
    mode fills new memory (NaN, the largest integer), so padding rows the op left would show."""
    torch.use_deterministic_algorithms(True)
    try:
        _check_entry_point_results(case)
    finally:
        torch.use_deterministic_algorithms(False)


def _check_entry_point_results(case):
    x = _values((16, 128), 7, torch.bfloat16)
    psum = _psum(16, 7)
    topk = randn((16,), 8)
    if case[1] == "bf16":
        y, valid, _ = reference.swiglu_forward(x, psum, topk, RSF, 0.5, ALIGNMENT, "ascend")
        args = (x, "bf16", psum, topk, RSF, 0.5)
        for out in (swiglu_forward(*args, torch.zeros(4, dtype=torch.int64), target="torch"),
                    swiglu_forward_parallel(*args, torch.zeros(4, dtype=torch.int64))):
            assert_bitwise_equal(out[valid], to_dtype(y[valid], torch.bfloat16), "bf16 out")
            _assert_padding_zero([out], valid, "bf16 out")
        # fmt bf16/fp32 with num_per_channels None: the plain SwiGLU, one tensor (as TileKernels).
        plain = swiglu_forward_and_per_token_cast(x, "bf16", None, psum, topk, RSF, clamp_value=0.5,
                                                  clamped_count=torch.zeros(4, dtype=torch.int64))
        assert_bitwise_equal(plain[valid], to_dtype(y[valid], torch.bfloat16), "plain out")
        _assert_padding_zero([plain], valid, "plain out")
        with pytest.raises(ValueError, match="target 'torch'"):
            swiglu_forward_parallel(x, "fp32", target="torch")
        return
    (data, sf), valid, _ = reference.swiglu_forward_and_per_token_cast(x, 32, psum, topk, RSF, True, True, True,
                                                                        0.5, ALIGNMENT)
    options = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True, clamp_value=0.5)
    for target, run in (("torch", swiglu_forward_and_per_token_cast),
                        (None, swiglu_forward_and_per_token_cast_parallel)):
        got = run(x, "e4m3", 32, psum, topk, RSF, clamped_count=torch.zeros(4, dtype=torch.int64), target=target,
                  **options)
        assert_bitwise_equal(got[0][valid], data[valid], "data")
        assert_bitwise_equal(got[1][valid], sf[valid], "sf")
        _assert_padding_zero(got, valid, f"e4m3 on {target}")
    with pytest.raises(ValueError, match="target 'torch'"):
        swiglu_forward_and_per_token_cast_parallel(x, "e4m3", 32, target="torch")


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference(case):
    _check_case(case)
    if case in COVERING[:2]:
        # In the same test, so the entry points reuse the kernel this worker just compiled.
        _check_entry_points(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(case)


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    _check_case(case, SIM_SHAPES, target="ascend-sim", offset=SIM_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(case, SIM_SHAPES, target="ascend-sim", offset=SIM_FULL.index(case))


@pytest.mark.slow
def test_large_shape():
    _check_case(COVERING[1], shapes=[(4001, 3584)])


def test_rows_outside_experts():
    # Spec §0.5's example at alignment 4: counts [3, 0, 5] -> psum [3, 4, 9] over 12 rows; rows 3,
    # 9, 10 and 11 are padding (``_run`` checks they keep the sentinel). The kernel of COVERING[1].
    set_token_alignment(4)
    x = _values((12, 128), 3, torch.bfloat16)
    psum = torch.tensor([3, 4, 9], dtype=torch.int32)
    counter = torch.zeros(4, dtype=torch.int64)
    data, sf = _run(COVERING[1], x, psum, randn((12,), 4), RSF, 0.5, counter, "cpu", "ascend")
    rows = torch.tensor([0, 1, 2, 4, 5, 6, 7, 8])
    assert (data.view(torch.uint8)[rows] != SENTINEL).any(dim=1).all()
    assert counter[3].item() == 8 * 128
    # TileKernels' empty expert may also end before its aligned start (psum [3, 3, 9]): the same rows.
    early_end = torch.tensor([3, 3, 9], dtype=torch.int32)
    assert torch.equal(expert_rows(early_end, 12, 4), expert_rows(psum, 12, 4))
    again = _run(COVERING[1], x, early_end, randn((12,), 4), RSF, 0.5, torch.zeros(4, dtype=torch.int64), "cpu",
                 "ascend")
    assert_bitwise_equal(again[0][rows], data[rows], "data")
    assert_bitwise_equal(again[1][rows], sf[rows], "sf")


def test_clamp_counts_example():
    # Spec §6.2: c = 0.5, gate [0.7, 0.5, -3], up [0.6, -0.6, 0.5] (bf16; the other 61 channels 0)
    # -> +[1, 1, 1, 64]; the outputs use a' = [0.5, 0.5, -3], b' = [0.5, -0.5, 0.5]. One expert
    # over the one row, weight 1: the kernel of COVERING[0].
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, :3] = torch.tensor([0.7, 0.5, -3.0])
    x[0, 64:67] = torch.tensor([0.6, -0.6, 0.5])
    psum = torch.tensor([1], dtype=torch.int32)
    counter = torch.tensor([10, 20, 30, 40], dtype=torch.int64)
    args = (x, "bf16", psum, torch.ones(1), 1.0, 0.5, counter)
    out = swiglu_forward(*args)
    assert counter.tolist() == [11, 21, 31, 104]
    silu = torch.tensor([0.5, 0.5, -3.0], dtype=torch.float64)
    expected = silu / (1 + torch.exp(-silu)) * torch.tensor([0.5, -0.5, 0.5], dtype=torch.float64)
    # bf16 output of the exact value: half an ulp of bf16, plus the fp32 steps.
    torch.testing.assert_close(out[0, :3].double(), expected, rtol=2.0 ** -8, atol=0)
    assert (out[0, 3:] == 0).all()
    # Counters accumulate and are never reset.
    swiglu_forward(*args)
    assert counter.tolist() == [12, 22, 32, 168]


def test_division_flavors():
    # Gates 2^-130 (subnormal) and 1.5 * 2^-126 (normal) over 1 + exp(-a) = 2: IEEE (cuda) gives
    # the subnormal quotients, the Ascend vector division flushes operand and quotient to +0.
    # -100: exp(100) overflows, -100 / inf = -0 in both. The kernels meet such gates in every
    # case's inputs (``_values``).
    gate = torch.tensor([2.0 ** -130, 1.5 * 2.0 ** -126, -100.0, 1.0])
    cuda, ascend = reference.silu(gate, "cuda"), reference.silu(gate, "ascend")
    assert cuda[0].item() == 2.0 ** -131 and cuda[1].item() == 1.5 * 2.0 ** -127
    assert ascend[0].item() == 0.0 and ascend[1].item() == 0.0
    assert cuda[2].item() == 0.0 and torch.signbit(cuda[2]) and torch.equal(cuda[2:], ascend[2:])


def test_strided_rows():
    # Unit stride along the channels, a padded row stride: the kernel of COVERING[0].
    base = _values((19, 320), 5, torch.bfloat16)
    x = base[:, :256]
    assert not x.is_contiguous()
    psum = _psum(19, 5)
    topk = randn((19,), 6)
    counter = torch.zeros(4, dtype=torch.int64)
    got = swiglu_forward(x, "bf16", psum, topk, RSF, 0.5, counter)
    y, valid, counts = reference.swiglu_forward(x.contiguous(), psum, topk, RSF, 0.5, ALIGNMENT, "ascend")
    assert_bitwise_equal(got[valid], to_dtype(y[valid], torch.bfloat16), "out")
    assert torch.equal(counter, counts)


def test_no_rows_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="N == 0")
    counter = torch.tensor([1, 2, 3, 4])
    data, sf = swiglu_forward_and_per_token_cast(torch.empty(0, 256), "e4m3", 32, torch.zeros(2, dtype=torch.int32),
                                                 clamp_value=1.0, clamped_count=counter, round_sf=True,
                                                 use_packed_ue8m0=True, flavor="cuda")
    assert data.shape == (0, 128) and data.dtype == torch.float8_e4m3fn
    assert sf.shape == (0, 1) and sf.dtype == torch.int32
    assert counter.tolist() == [1, 2, 3, 4]
