"""The prenorm GEMM of norm_fn (forward and backward) on cpu, bit for bit against the reference
``reference.pre_norm_fn_gemm`` (which sums in the cpu kernel's stated order), both flavors; the
errors of both against a float64 evaluation of the formulas within the fp32 summation bound; the
float64 backward against torch autograd; the TF32 operand split on cpu and ascend-sim.

Every product of the GEMMs is exact in fp32 (bf16 x TF32, TF32 x TF32), so a sum of ``n`` of
them accumulated in fp32 (any order) lies within ``γ(n - 1) · Σ|p|`` of the exact sum, with
``γ(m) = m·u / (1 - m·u)`` and ``u = 2^-24`` (Higham, Accuracy and Stability, §4.2). That bound
is what separates the cpu kernel from the float64 value, and (doubled: the matrix units add
``2n`` products, the TF32 operand as bf16 hi and lo) from the matrix units' results.

Default: one forward and one backward specialisation (K = 4·64·2 = 512, n3 = 24, 2 splits),
token counts 0, 1 and 37 (a partial token block); on ascend-sim (the Cube unit model runs the
mixed kernels) one forward call of 37 tokens and two backward calls of 65 (three token blocks,
under consumers_first and producers_first): the square sums and ``fn_grad`` bit for bit,
``out_mul_splitted`` and ``x_grad`` within the bound between the cpu order and the Cube's. Every
pipe schedule, more token blocks than AI cores, the TF32 operand kernel on
ascend-sim, the sweeps over hidden sizes 1280-7168, 4096+ tokens, other mix widths and splits are
``slow``. The Cube model's negative controls break the emitted kernels (a cross-core wait, a pipe
wait, an NZ layout parameter): one by default, the others ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core import ascend_sim
from vmi_core import kernel as vmi_kernel
from vmi_core.ascend_sim import AscendSimError, SimKernel
from vmi_core.compile import cache_dir, lower_ascend
from vmi_core.tools.testing import REUSE_SCHEDULES, SIM_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc import mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd
from vmi_mhc.kernels import pre_norm_fn_gemm as parallel
from vmi_mhc.reference import pre_norm_fn_gemm as reference

U = 2.0**-24
FLAVORS = ("ascend", "cuda")
K_DEFAULT, MIX, SPLITS = 512, 24, 2
TOKENS = (0, 1, 37)


def gamma(additions: int) -> float:
    return additions * U / (1 - additions * U)


def forward_inputs(num_tokens: int, hidden: int, mix: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # As the sources' tests: a residual around 1 with a per-stream gain, a small projection.
    x = randn((num_tokens, hidden), seed, torch.bfloat16)
    fn = randn((mix, hidden), seed + 1) * 1e-2
    return x, fn


def backward_inputs(num_tokens: int, hidden: int, mix: int, seed: int) -> dict:
    x, fn = forward_inputs(num_tokens, hidden, mix, seed)
    return {"out_mul_grad": randn((num_tokens, mix), seed + 2), "sqrsum_grad": randn((num_tokens,), seed + 3) * 1e-3,
            "x": x, "fn": fn, "x_grad": randn((num_tokens, hidden), seed + 4, torch.bfloat16)}


def check_forward(num_tokens: int, hidden: int, mix: int, splits: int, seed: int, flavor=None) -> None:
    x, fn = forward_inputs(num_tokens, hidden, mix, seed)
    out_mul = torch.full((splits, num_tokens, mix), float("nan"))
    sqrsum = torch.full((splits, num_tokens), float("nan"))
    got = mhc_pre_norm_fn_gemm_fwd(x, fn, out_mul, sqrsum, splits, target="cpu", flavor=flavor)
    assert got[0] is out_mul and got[1] is sqrsum
    want = reference.pre_norm_fn_gemm_fwd(x, fn, splits)
    label = f"T={num_tokens} K={hidden} n3={mix} S={splits} flavor={flavor}"
    assert_bitwise_equal(out_mul, want[0], f"out_mul_splitted [{label}]")
    assert_bitwise_equal(sqrsum, want[1], f"sqrsum_splitted [{label}]")


def check_backward(num_tokens: int, hidden: int, mix: int, seed: int, flavor=None) -> None:
    inputs = backward_inputs(num_tokens, hidden, mix, seed)
    x_grad = inputs["x_grad"].clone()
    fn_grad = torch.full((mix, hidden), float("nan"))
    got = mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": x_grad}, fn_grad=fn_grad, target="cpu", flavor=flavor)
    assert got[0] is x_grad and got[1] is fn_grad
    want = reference.pre_norm_fn_gemm_bwd(**inputs)
    label = f"T={num_tokens} K={hidden} n3={mix} flavor={flavor}"
    assert_bitwise_equal(x_grad, want[0], f"x_grad [{label}]")
    assert_bitwise_equal(fn_grad, want[1], f"fn_grad [{label}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_forward_matches_reference(flavor):
    for seed, num_tokens in enumerate(TOKENS):
        check_forward(num_tokens, K_DEFAULT, MIX, SPLITS, seed, flavor)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_backward_matches_reference(flavor):
    for seed, num_tokens in enumerate(TOKENS):
        check_backward(num_tokens, K_DEFAULT, MIX, seed, flavor)


def test_torch_target_is_the_reference():
    inputs = backward_inputs(37, K_DEFAULT, MIX, 7)
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(inputs["x"], inputs["fn"], n_splits=SPLITS, target="torch")
    want = reference.pre_norm_fn_gemm_fwd(inputs["x"], inputs["fn"], SPLITS)
    assert_bitwise_equal(out_mul, want[0], "out_mul_splitted")
    assert_bitwise_equal(sqrsum, want[1], "sqrsum_splitted")
    x_grad, fn_grad = mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="torch")
    want = reference.pre_norm_fn_gemm_bwd(**inputs)
    assert_bitwise_equal(x_grad, want[0], "x_grad")
    assert_bitwise_equal(fn_grad, want[1], "fn_grad")


def test_forward_error_within_the_fp32_sum_bound():
    # The default kernels, 100 tokens: per output, |kernel - float64| <= γ(n - 1) Σ|p| for its n
    # products (k of the split; the square sums: a lane's K_s / 64 squares, then 6 folds).
    x, fn = forward_inputs(100, K_DEFAULT, MIX, 3)
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=SPLITS, target="cpu")
    exact_mul, exact_sq = reference.pre_norm_fn_gemm_fwd_float64(x, fn, SPLITS)
    width = K_DEFAULT // SPLITS
    xs = x.double().reshape(100, SPLITS, width).transpose(0, 1)
    magnitude = xs.abs() @ reference.tf32_operand(fn).double().abs().reshape(MIX, SPLITS, width).permute(1, 2, 0)
    assert ((out_mul.double() - exact_mul).abs() <= gamma(width - 1) * magnitude).all()
    assert ((sqrsum.double() - exact_sq).abs() <= gamma(width // 64 + 6) * exact_sq).all()
    assert not torch.equal(out_mul.double(), exact_mul), "fp32 sums that are all exact test no order"


def test_backward_error_within_the_fp32_sum_bound():
    inputs = backward_inputs(100, K_DEFAULT, MIX, 4)
    x_grad, fn_grad = mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="cpu")
    exact_x_grad, exact_fn_grad = reference.pre_norm_fn_gemm_bwd_float64(**inputs)
    d = reference.tf32_operand(inputs["out_mul_grad"]).double()
    xd = inputs["x"].double()
    fn_magnitude = d.abs().T @ xd.abs()
    assert ((fn_grad.double() - exact_fn_grad).abs() <= gamma(100 - 1) * fn_magnitude).all()
    # x_grad: n3 products, the buffer and the square-sum term in fp32 (n3 + 1 additions, one
    # rounding of 2·x·d_sqrsum), then one bf16 rounding (half an ulp: at most 2^-8 relative).
    terms = (inputs["x_grad"].double().abs() + d.abs() @ reference.tf32_operand(inputs["fn"]).double().abs()
             + 2 * xd.abs() * inputs["sqrsum_grad"].double().abs()[:, None])
    bound = 2.0**-8 * exact_x_grad.abs() + (1 + 2.0**-8) * gamma(MIX + 2) * terms
    assert ((x_grad.double() - exact_x_grad).abs() <= bound).all()


class _Gemm64(torch.autograd.Function):
    """The float64 forward ``(x·vᵀ, Σ x²)`` with the reference's backward formulas."""

    @staticmethod
    def forward(ctx, x, v):
        ctx.save_for_backward(x, v)
        return x @ v.T, (x * x).sum(-1)

    @staticmethod
    def backward(ctx, out_mul_grad, sqrsum_grad):
        x, v = ctx.saved_tensors
        return reference.gemm_bwd_formula(out_mul_grad, sqrsum_grad, x, v)


def test_float64_backward_is_the_gradient_of_the_float64_forward():
    x = randn((3, 32), 5).double().requires_grad_()
    v = randn((2, 32), 6).double().requires_grad_()
    assert torch.autograd.gradcheck(_Gemm64.apply, (x, v))
    # The float64 backward entry point (TF32 d_out_mul values: its rounding changes nothing).
    xb, fn = forward_inputs(3, 32, 2, 7)
    g, h = reference.round_to_tf32(randn((3, 2), 8)), randn((3,), 9)
    x64 = xb.double().requires_grad_()
    v64 = reference.tf32_operand(fn).double().requires_grad_()
    ((x64 @ v64.T * g.double()).sum() + ((x64 * x64).sum(-1) * h.double()).sum()).backward()
    x_grad, fn_grad = reference.pre_norm_fn_gemm_bwd_float64(g, h, xb, fn, torch.zeros(3, 32))
    torch.testing.assert_close(x_grad, x64.grad, rtol=1e-13, atol=0)
    torch.testing.assert_close(fn_grad, v64.grad, rtol=1e-13, atol=0)


def test_round_to_tf32_examples():
    # Spec §3.4.2: half away from zero to 10 mantissa bits.
    values = torch.tensor([1.0, 1 + 2**-11, -(1 + 2**-11), 0.1, 1 + 2**-12, float("inf"), 3.4028235e38])
    want = torch.tensor([1.0, 1 + 2**-10, -(1 + 2**-10), 0.099975586, 1.0, float("inf"), float("inf")])
    assert_bitwise_equal(reference.round_to_tf32(values), want, "round_to_tf32")


def test_tf32_split_is_exact():
    v = reference.round_to_tf32(randn((4096,), 8) * torch.logspace(-30, 30, 4096))
    assert_bitwise_equal(reference.tf32_operand(v), v, "hi + lo")


@pytest.mark.parametrize("target", ["cpu", pytest.param("ascend-sim", marks=pytest.mark.slow)])
def test_tf32_operand_kernel_matches_reference(target):
    # The d_out_mul layout (rows x 24 into 32 columns, extra zero rows): special values, a NaN
    # whose payload is only in the dropped bits, subnormals, values that round to infinity.
    src = randn((37, MIX), 9) * torch.logspace(-40, 38, MIX)
    src[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 3.4028235e38, 1e-45, 2.0**-120])
    src[1, 0] = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)
    hi, lo = parallel.tf32_operand(src, 64, parallel.N_PAD, target)
    want_hi, want_lo = reference.tf32_split(reference.round_to_tf32(src))
    assert_bitwise_equal(hi[:37, :MIX].view(torch.int16).to(torch.int64) & 0xFFFF, want_hi, f"hi [{target}]")
    assert_bitwise_equal(lo[:37, :MIX].view(torch.int16).to(torch.int64) & 0xFFFF, want_lo, f"lo [{target}]")
    assert not hi[37:].view(torch.int16).any() and not hi[:, MIX:].view(torch.int16).any()
    assert not lo[37:].view(torch.int16).any() and not lo[:, MIX:].view(torch.int16).any()


def check_forward_on_sim(num_tokens: int, seed: int) -> None:
    # The Cube adds each output's 2·K_s products (x·hi, then x·lo, per 256-column chunk) in its own
    # order: within the documented bound of the cpu bits; the square sums (SIMD, the fixed lane
    # order) bit for bit.
    x, fn = forward_inputs(num_tokens, K_DEFAULT, MIX, seed)
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=SPLITS, target="ascend-sim")
    want_mul, want_sq = reference.pre_norm_fn_gemm_fwd(x, fn, SPLITS)
    label = f"T={num_tokens} schedule={ascend_sim.schedule()}"
    assert_bitwise_equal(sqrsum, want_sq, f"sqrsum_splitted [{label}]")
    width = K_DEFAULT // SPLITS
    xs = x.double().reshape(num_tokens, SPLITS, width).transpose(0, 1)
    magnitude = xs.abs() @ reference.tf32_operand(fn).double().abs().reshape(MIX, SPLITS, width).permute(1, 2, 0)
    bound = (gamma(width - 1) + gamma(2 * width - 1)) * magnitude
    assert ((out_mul.double() - want_mul.double()).abs() <= bound).all(), f"out_mul_splitted [{label}]"


def check_backward_on_sim(num_tokens: int, seed: int) -> None:
    # fn_grad runs on the vector unit in the cpu order: bit for bit. x_grad's products are the
    # Cube's four bf16 GEMMs (4·n3 products in its order): within one bf16 rounding of the exact
    # value plus the fp32 sum bound.
    inputs = backward_inputs(num_tokens, K_DEFAULT, MIX, seed)
    x_grad, fn_grad = mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="ascend-sim")
    label = f"T={num_tokens} schedule={ascend_sim.schedule()}"
    assert_bitwise_equal(fn_grad, reference.pre_norm_fn_gemm_bwd(**inputs)[1], f"fn_grad [{label}]")
    exact_x_grad = reference.pre_norm_fn_gemm_bwd_float64(**inputs)[0]
    d = reference.tf32_operand(inputs["out_mul_grad"]).double()
    terms = (inputs["x_grad"].double().abs() + d.abs() @ reference.tf32_operand(inputs["fn"]).double().abs()
             + 2 * inputs["x"].double().abs() * inputs["sqrsum_grad"].double().abs()[:, None])
    bound = 2.0**-8 * exact_x_grad.abs() + (1 + 2.0**-8) * gamma(4 * MIX + 2) * terms
    assert ((x_grad.double() - exact_x_grad).abs() <= bound).all(), f"x_grad [{label}]"


def test_forward_on_ascend_sim():
    check_forward_on_sim(37, 11)


def test_backward_on_ascend_sim():
    # 65 tokens: 3 token blocks of BLOCK_T (the last partial) that each core walks, more than the 2
    # versions of its per-block buffers, under consumers_first and producers_first, where a
    # missing wait between pipes shows up.
    for seed, schedule in enumerate(REUSE_SCHEDULES, start=12):
        with sim_schedule(schedule):
            check_backward_on_sim(65, seed)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SIM_SCHEDULES)
def test_ascend_sim_under_every_schedule(schedule):
    # One token, a partial block, and more token blocks than AI cores (every core loops).
    with sim_schedule(schedule):
        for seed, num_tokens in enumerate((1, 37, 32 * 33 + 5)):
            check_forward_on_sim(num_tokens, 20 + seed)
            check_backward_on_sim(num_tokens, 30 + seed)


def test_every_thread_count_gives_the_same_bits(vmi_env):
    inputs = backward_inputs(300, K_DEFAULT, MIX, 11)
    results = []
    for threads in ("1", "3"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        results.append((mhc_pre_norm_fn_gemm_fwd(inputs["x"], inputs["fn"], n_splits=SPLITS, target="cpu"),
                        mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="cpu")))
    for a, b in zip(*results, strict=True):
        for got, want in zip(a, b, strict=True):
            assert_bitwise_equal(got, want, "one thread vs three")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    x, fn = forward_inputs(0, K_DEFAULT, MIX, 12)
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=SPLITS, target="cpu")
    assert out_mul.shape == (SPLITS, 0, MIX) and sqrsum.shape == (SPLITS, 0)
    fn_grad = torch.full((MIX, K_DEFAULT), float("nan"))
    for target in ("cpu", "torch"):
        x_grad, got = mhc_pre_norm_fn_gemm_bwd(torch.empty(0, MIX), torch.empty(0), x, fn, x.clone(), fn_grad,
                                               target=target)
        assert got is fn_grad and not fn_grad.any() and x_grad.shape == (0, K_DEFAULT)


def test_non_finite_values_propagate():
    # A NaN in x (row 3, split 1), +inf in fn (row 2, split 0), +inf in out_mul_grad (row 5):
    # as the reference (IEEE arithmetic of the exact products), NaN payloads aside.
    inputs = backward_inputs(40, K_DEFAULT, MIX, 13)
    inputs["x"][3, 300] = float("nan")
    inputs["fn"][2, 10] = float("inf")
    inputs["out_mul_grad"][5, 4] = float("inf")
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(inputs["x"], inputs["fn"], n_splits=SPLITS, target="cpu")
    want = reference.pre_norm_fn_gemm_fwd(inputs["x"], inputs["fn"], SPLITS)
    assert_bitwise_equal(out_mul, want[0], "out_mul_splitted", any_nan=True)
    assert_bitwise_equal(sqrsum, want[1], "sqrsum_splitted", any_nan=True)
    assert out_mul[1, 3].isnan().all() and sqrsum[1, 3].isnan() and out_mul[0, 3, 3:].isfinite().all()
    assert not out_mul[0, :, 2].isfinite().any() and out_mul[1, torch.arange(40) != 3, 2].isfinite().all()
    x_grad, fn_grad = mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="cpu")
    want = reference.pre_norm_fn_gemm_bwd(**inputs)
    assert_bitwise_equal(x_grad, want[0], "x_grad", any_nan=True)
    assert_bitwise_equal(fn_grad, want[1], "fn_grad", any_nan=True)
    assert not x_grad[5].float().isfinite().all() and not fn_grad[4].isfinite().all()


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [1280, 2560, 4096, 7168])
@pytest.mark.parametrize("splits", [1, 16])
def test_forward_hidden_sizes(hidden, splits):
    check_forward(77, 4 * hidden, MIX, splits, hidden + splits)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [1280, 7168])
def test_backward_hidden_sizes(hidden):
    check_backward(77, 4 * hidden, MIX, hidden)


@pytest.mark.slow
@pytest.mark.parametrize("mix", [1, 8, 32])
def test_other_mix_widths(mix):
    # n3 = 8 is n = 2 streams; the kernels depend on n3 <= 32 only.
    check_forward(37, 1024, mix, 4, mix)
    check_backward(37, 1024, mix, mix)


@pytest.mark.slow
def test_many_tokens():
    check_forward(4133, 4 * 1280, MIX, 16, 20)
    check_backward(4133, 4 * 1280, MIX, 21)


# The Cube model's negative controls: each breaks the emitted source in one place (a cross-core
# wait, a pipe wait, an NZ layout parameter) and runs it under every pipe schedule; the model must
# report an error or the results must differ from the unbroken kernel's. More token blocks than AI
# cores: every core runs two work items.
CONTROL_TOKENS = 32 * 32 + 37


def _replace_once(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"expected exactly one {old!r} in the source"
    return source.replace(old, new)


# name -> (forward or backward kernel, how its source is broken)
SIM_MUTATIONS = {
    # read-after-write across cores: the vector core reads the products before the L0C -> UB copy lands
    "drop the vector core's cross-core wait": ("bwd", lambda s: _replace_once(
        s, "asc_sync_intra_wait(PIPE_V, 1);\n", "")),
    # write-after-read across cores: the Cube overwrites the products the vector core still reads
    "drop the Cube's cross-core wait": ("bwd", lambda s: _replace_once(
        s,
        "          asc_sync_intra_wait(PIPE_FIX, 0);\n          asc_sync_wait(PIPE_M, PIPE_FIX",
        "          asc_sync_wait(PIPE_M, PIPE_FIX")),
    # read-after-write within the Cube core: the GEMM reads L1 before the loads land
    "drop the MTE2 -> MTE1 wait": ("fwd", lambda s: _replace_once(
        s, "asc_sync_wait(PIPE_MTE2, PIPE_MTE1, static_cast<event_t>(0));\n", "")),
    # a wrong NZ layout of x in L1: C0 columns 16 rows apart instead of 32
    "x in L1 with the wrong C0 stride": ("fwd", lambda s: _replace_once(
        s, "asc_set_gm2l1_nz_para(1, 1, static_cast<uint16_t>(32), 0);\n"
           "          asc_copy_gm2l1_nd2nz(((__cbuf__ bfloat16_t*)buf_dyn_l1), (&(X[",
        "asc_set_gm2l1_nz_para(1, 1, static_cast<uint16_t>(16), 0);\n"
        "          asc_copy_gm2l1_nd2nz(((__cbuf__ bfloat16_t*)buf_dyn_l1), (&(X[")),
    # a wrong NZ -> ND store: the accumulator's column blocks read 16 rows apart instead of 32
    "L0C stored with the wrong source stride": ("fwd", lambda s: _replace_once(
        s, "24, min(32, max((M - row0), 0)), 24, 32,", "24, min(32, max((M - row0), 0)), 24, 16,")),
}
DEFAULT_SIM_MUTATIONS = ("drop the vector core's cross-core wait",)


def _run(kind: str) -> tuple[torch.Tensor, ...]:
    if kind == "fwd":
        x, fn = forward_inputs(CONTROL_TOKENS, K_DEFAULT, MIX, 5)
        return mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=SPLITS, target="ascend-sim")
    inputs = backward_inputs(CONTROL_TOKENS, K_DEFAULT, MIX, 6)
    return mhc_pre_norm_fn_gemm_bwd(**{**inputs, "x_grad": inputs["x_grad"].clone()}, target="ascend-sim")


@pytest.mark.parametrize("mutation", [pytest.param(m, marks=[] if m in DEFAULT_SIM_MUTATIONS else [pytest.mark.slow])
                                      for m in SIM_MUTATIONS])
def test_cube_model_reports_a_broken_kernel(mutation, monkeypatch):
    kind, mutate = SIM_MUTATIONS[mutation]
    build = (parallel.build_gemm_fwd if kind == "fwd" else parallel.build_gemm_bwd).build
    want = _run(kind)
    compile_kernel = vmi_kernel.cached_kernel

    def broken_kernel(builder, spec, target, **config):
        if builder is not build:
            return compile_kernel(builder, spec, target, **config)
        func = builder(spec, "ascend")
        lowering = lower_ascend(func, target, **config)
        source = mutate(lowering.source)
        assert source != lowering.source
        return SimKernel(func, source, lowering.cores, lowering.ub_bytes, cache_dir() / "ascend-sim")

    monkeypatch.setattr(vmi_kernel, "cached_kernel", broken_kernel)
    for name in SIM_SCHEDULES:
        with sim_schedule(name):
            try:
                got = _run(kind)
            except AscendSimError as error:
                assert "gemm_" in str(error) and "core" in str(error)
                continue
        assert not all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), \
            f"{mutation!r} went unnoticed under {name}"
