"""expand on the cpu and ascend-sim targets, bit for bit against the torch reference
``reference.expand`` (spec §3.1), the reference against float64 autograd, and the kernels' error
against the float64 sum.

The kernels are specialised on the stream count only (token count and hidden size are runtime
values), so the default set runs one specialisation (n = 4) over hidden sizes with and without tail
tiles, and the backward on ascend-sim; other stream counts, large token counts, the hidden-size
sweep and the forward (a copy) on ascend-sim run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc import expand_to_mhc_bwd, expand_to_mhc_bwd_parallel, expand_to_mhc_fwd, expand_to_mhc_fwd_parallel
from vmi_mhc.reference import expand as reference

# Hidden sizes: 1 (a single column), 200 (a tail inside one tile), 1280 (two whole tiles and a
# tail) and 7168 (whole tiles only).
HIDDEN = (1, 200, 1280, 7168)
TOKENS = (0, 1, 37)


def run_fwd(x, n, *, target=None, flavor=None):
    o = torch.full((x.shape[0], n, x.shape[1]), float("nan"), dtype=torch.bfloat16)
    assert expand_to_mhc_fwd(x, o, target=target, flavor=flavor) is o
    return o


def run_bwd(o_grad, *, target=None, flavor=None):
    x_grad = torch.full(o_grad[:, 0].shape, float("nan"), dtype=torch.bfloat16)
    assert expand_to_mhc_bwd(o_grad, x_grad, target=target, flavor=flavor) is x_grad
    return x_grad


def check(n, tokens, hidden, *, target=None, flavor=None, directions=("fwd", "bwd"), schedules=(None,)) -> None:
    """Each size against one reference, one launch per ascend-sim pipe schedule (None: the default)."""
    for seed, num_tokens in enumerate(tokens):
        for h in hidden:
            if "fwd" in directions:
                x = randn((num_tokens, h), seed, torch.bfloat16)
                want = reference.expand_to_mhc_fwd(x, n)
                for schedule in schedules:
                    with sim_schedule(schedule):
                        o = run_fwd(x, n, target=target, flavor=flavor)
                    assert_bitwise_equal(o, want, f"o [n={n} T={num_tokens} H={h} target={target} "
                                                  f"flavor={flavor} schedule={schedule}]")
            if "bwd" in directions:
                o_grad = randn((num_tokens, n, h), seed + 1, torch.bfloat16)
                want = reference.expand_to_mhc_bwd(o_grad)
                for schedule in schedules:
                    with sim_schedule(schedule):
                        x_grad = run_bwd(o_grad, target=target, flavor=flavor)
                    assert_bitwise_equal(x_grad, want, f"x_grad [n={n} T={num_tokens} H={h} target={target} "
                                                       f"flavor={flavor} schedule={schedule}]")


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_matches_reference(flavor):
    check(4, TOKENS, HIDDEN, flavor=flavor)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_other_stream_counts(n):
    check(n, (1, 37), (200, 1280))


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [1280, 1920, 2560, 4096, 4224, 5120, 7168, 8192, 10000])
def test_many_tokens(hidden):
    check(4, (4099,), (hidden,))


def test_matches_reference_on_ascend_sim():
    # The backward (the forward is a copy, under slow): one token, and 70 tokens over the 64 cores;
    # a tail tile and two whole tiles; the single rounding. At 70 x 1280 (210 tiles) cores 0..17
    # run 4 tiles on 3 buffer versions, so each size runs under both schedules that expose a
    # missing wait (consumers first: read-after-write; producers first: write-after-read).
    check(4, (1, 70), (200, 1280), target="ascend-sim", directions=("bwd",),
          schedules=REUSE_SCHEDULES)
    check_backward_rounds_once("ascend-sim")


@pytest.mark.slow
def test_forward_on_ascend_sim():
    with sim_schedule("consumers_first"):
        check(4, (1, 70), (200, 1280), target="ascend-sim", directions=("fwd",))


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 8])
def test_other_stream_counts_on_ascend_sim(n):
    check(n, (3, 130), (64, 1000), target="ascend-sim")


def check_backward_rounds_once(target=None):
    # Spec §3.1.2's worked example: 1 + 2^-8 + 2^-8 + 2^-8 = 1.01171875 in fp32 is 1.015625 in
    # bf16; rounding after each addition would give 1.0 (each 1 + 2^-8 is a tie to even).
    o_grad = torch.tensor([1.0, 2.0**-8, 2.0**-8, 2.0**-8], dtype=torch.bfloat16).view(1, 4, 1).repeat(3, 1, 70)
    x_grad = run_bwd(o_grad, target=target)
    assert torch.equal(x_grad, torch.full((3, 70), 1.015625, dtype=torch.bfloat16))


def test_backward_rounds_once():
    check_backward_rounds_once()


def test_forward_copies_every_bit_pattern():
    # Every bf16 pattern (NaN payloads, signed zeros, infinities, subnormals) arrives in every stream.
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(64, 1024)
    o = run_fwd(x, 4)
    for m in range(4):
        assert_bitwise_equal(o[:, m], x, f"stream {m}", check_stride=False)


def test_backward_non_finite_and_signed_zeros():
    # Column 0: NaN; 1: +inf and -inf (NaN); 2: +inf; 3: a finite sum past the bf16 range (+inf);
    # 4: every stream -0 (-0: the sum starts from stream 0); 5: -0 and +0 (+0).
    big = 3.0e38
    columns = [[float("nan"), 1, 2, 3], [float("inf"), float("-inf"), 0, 0], [float("inf"), 1, 1, 1],
               [big, big, 0, 0], [-0.0, -0.0, -0.0, -0.0], [-0.0, 0.0, -0.0, -0.0]]
    o_grad = torch.tensor(columns, dtype=torch.bfloat16).t().unsqueeze(0).repeat(2, 1, 1).contiguous()
    x_grad = run_bwd(o_grad)
    assert_bitwise_equal(x_grad, reference.expand_to_mhc_bwd(o_grad), "x_grad", any_nan=True)
    assert x_grad[:, :2].isnan().all()
    assert (x_grad[:, 2:4] == float("inf")).all()
    assert torch.equal(x_grad[:, 4:].float().sign().abs(), torch.zeros(2, 2))
    assert x_grad[:, 4].float().signbit().all() and not x_grad[:, 5].float().signbit().any()


def test_backward_error_against_float64():
    # x_grad = bf16(fp32 sum): three fp32 additions, each within 2^-24 of its result, then one bf16
    # rounding within 2^-8 (relative, round to nearest): |x_grad - exact| <= 2^-8 |exact| +
    # (1 + 2^-8) 3 * 2^-24 * sum |o_grad| (the fp32 errors, carried through the final rounding).
    o_grad = randn((257, 4, 1280), 5, torch.bfloat16)
    x_grad = run_bwd(o_grad).double()
    exact = reference.expand_to_mhc_bwd_exact(o_grad)
    bound = 2.0**-8 * exact.abs() + (1 + 2.0**-8) * 3 * 2.0**-24 * o_grad.double().abs().sum(1)
    assert ((x_grad - exact).abs() <= bound).all()


def test_reference_backward_is_the_gradient():
    # The float64 backward is the adjoint of the forward (gradcheck), and equals autograd's.
    class Expand(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return reference.expand_to_mhc_fwd(x, 3)

        @staticmethod
        def backward(ctx, o_grad):
            return reference.expand_to_mhc_bwd_exact(o_grad)

    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Expand.apply, (x,))
    o_grad = torch.randn(5, 3, 7, dtype=torch.float64)
    (want,) = torch.autograd.grad(x.unsqueeze(1).expand(5, 3, 7), x, o_grad)
    assert torch.allclose(reference.expand_to_mhc_bwd_exact(o_grad), want, rtol=0, atol=1e-15)


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    for target in (None, "torch"):
        o = expand_to_mhc_fwd(torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, 4, 64, dtype=torch.bfloat16),
                              target=target)
        assert o.shape == (0, 4, 64)
        x_grad = expand_to_mhc_bwd(torch.empty(0, 4, 64, dtype=torch.bfloat16),
                                   torch.empty(0, 64, dtype=torch.bfloat16), target=target)
        assert x_grad.shape == (0, 64)


def test_parallel_entry_points_and_torch_target_agree():
    x = randn((9, 300), 7, torch.bfloat16)
    o = torch.empty(9, 4, 300, dtype=torch.bfloat16)
    assert_bitwise_equal(expand_to_mhc_fwd_parallel(x, o), run_fwd(x, 4, target="torch"), "o")
    o_grad = randn((9, 4, 300), 8, torch.bfloat16)
    x_grad = torch.empty(9, 300, dtype=torch.bfloat16)
    assert_bitwise_equal(expand_to_mhc_bwd_parallel(o_grad, x_grad), run_bwd(o_grad, target="torch"), "x_grad")


def test_custom_ops_allocate_and_write_outputs():
    # torch.ops.vmi.expand_to_mhc_fwd(x, n) allocates o; its .out overload writes a given one.
    x = randn((5, 96), 9, torch.bfloat16)
    o = torch.ops.vmi.expand_to_mhc_fwd(x, 4)
    assert_bitwise_equal(o, reference.expand_to_mhc_fwd(x, 4), "o")
    given = torch.empty(5, 4, 96, dtype=torch.bfloat16)
    torch.ops.vmi.expand_to_mhc_fwd.out(x, 4, o=given)
    assert_bitwise_equal(given, o, "o (out)")
    assert_bitwise_equal(torch.ops.vmi.expand_to_mhc_bwd(o), reference.expand_to_mhc_bwd(o), "x_grad")
