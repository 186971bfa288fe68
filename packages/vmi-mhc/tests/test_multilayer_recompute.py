"""mhc_multilayer_recompute on the cpu and ascend-sim targets (spec mhc §3.3; §5.2): every layer
input and every carried residual bit for bit (``torch.equal``) what ``mhc_pre_apply_mix_fwd`` then
``mhc_post_fwd`` give layer by layer on the same target and flavor, and what the reference
``vmi_mhc.reference.multilayer_recompute`` gives; the reference against float64.

The kernel is specialised on ``(n, H, L, L_post, flavor)``, so the default set builds one cpu
kernel per flavor (``L = 3, L_post = 2``: a pair of post layers and a last layer input alone) and
one small ascend-sim kernel (``L = L_post = 1``); ``H = 1000`` is one hidden tile with a 24-column
register tail clamped by the DMA. The token counts are 0, 1 and 70 (two cpu threads). The lists
are given both ways the dispatch handles them: as equally spaced views of one buffer (addressed in
place) and as separate tensors (stacked into a temporary). Other ``L``, ``L_post``, ``n``, hidden
sizes with several tiles and thousands of tokens run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc.ops.multilayer_recompute import mhc_multilayer_recompute, mhc_multilayer_recompute_parallel
from vmi_mhc.ops.post import mhc_post_fwd
from vmi_mhc.ops.pre_apply_mix import mhc_pre_apply_mix_fwd
from vmi_mhc.reference import multilayer_recompute as reference
from vmi_mhc.reference.post import mhc_post_fwd as post_reference
from vmi_mhc.reference.pre_apply_mix import mhc_pre_apply_mix_fwd as pre_apply_mix_reference

N = 4
HIDDEN = 1000
TOKENS = (0, 1, 70)
FLAVORS = ("ascend", "cuda")
INPUTS = ("initial_residual", "pre_mix_list", "layer_output_list", "post_mix_list", "comb_mix_list")


def _layers(count: int, shape: tuple, seed: int, dtype, stacked: bool) -> list[torch.Tensor]:
    """``count`` randn tensors of ``shape``: views of one ``(count, *shape)`` buffer, or each its own."""
    if stacked:
        return list(randn((count, *shape), seed, dtype).unbind(0))
    return [randn(shape, seed + layer, dtype) for layer in range(count)]


def make_inputs(num_tokens: int, hidden: int, layers: int, post_layers: int, seed: int, *, n: int = N,
                stacked: bool = True) -> dict:
    """Unnormalised randn mixes, as TileKernels' test draws them; the pre mixes ``(T, n, 1)``, the
    post mixes ``(T, n)`` (both layouts are accepted). With ``stacked``, the layer outputs and the
    comb mixes are views of one buffer, else every list tensor is its own."""
    return {
        "initial_residual": randn((num_tokens, n, hidden), seed, torch.bfloat16),
        "pre_mix_list": _layers(layers, (num_tokens, n, 1), seed + 100, torch.float32, False),
        "layer_output_list": _layers(post_layers, (num_tokens, hidden), seed + 200, torch.bfloat16, stacked),
        "post_mix_list": _layers(post_layers, (num_tokens, n), seed + 300, torch.float32, False),
        "comb_mix_list": _layers(post_layers, (num_tokens, n, n), seed + 400, torch.float32, stacked),
    }


def make_outputs(inputs: dict, *, stacked: bool = True) -> dict:
    """NaN-filled outputs: with ``stacked`` the layer inputs are views of one buffer and the
    residuals separate tensors, else the other way round."""
    r0 = inputs["initial_residual"]
    layers, post_layers = len(inputs["pre_mix_list"]), len(inputs["layer_output_list"])
    nan = float("nan")
    stack = torch.full((layers, *r0.shape[:-2], r0.shape[-1]), nan, dtype=torch.bfloat16).unbind(0)
    alone = [torch.full(r0.shape[:-2] + r0.shape[-1:], nan, dtype=torch.bfloat16) for _ in range(layers)]
    res_stack = torch.full((post_layers, *r0.shape), nan, dtype=torch.bfloat16).unbind(0)
    res_alone = [torch.full(r0.shape, nan, dtype=torch.bfloat16) for _ in range(post_layers)]
    return {"layer_input_list": list(stack if stacked else alone),
            "residual_list": list(res_alone if stacked else res_stack)}


def kernel_chain(inputs: dict, *, target=None, flavor=None) -> tuple[list, list]:
    """The unfused chain of vmi's kernels: pre_apply_mix, then post, layer by layer."""
    residual = inputs["initial_residual"]
    num_tokens, n, hidden = residual.shape
    layer_inputs, residuals = [], []
    for layer, pre in enumerate(inputs["pre_mix_list"]):
        o = torch.empty(num_tokens, hidden, dtype=torch.bfloat16)
        layer_inputs.append(mhc_pre_apply_mix_fwd(residual, pre, o, target=target, flavor=flavor))
        if layer < len(inputs["layer_output_list"]):
            out = mhc_post_fwd(inputs["layer_output_list"][layer].view(1, num_tokens, hidden),
                               residual.view(1, num_tokens, n, hidden),
                               inputs["post_mix_list"][layer].view(1, num_tokens, n, 1),
                               inputs["comb_mix_list"][layer].view(1, num_tokens, n, n), target=target, flavor=flavor)
            residual = out.view(num_tokens, n, hidden)
            residuals.append(residual)
    return layer_inputs, residuals


def reference_chain(inputs: dict, flavor: str) -> tuple[list, list]:
    """The unfused chain of part 1's references."""
    residual = inputs["initial_residual"]
    num_tokens, n, hidden = residual.shape
    layer_inputs, residuals = [], []
    for layer, pre in enumerate(inputs["pre_mix_list"]):
        layer_inputs.append(pre_apply_mix_reference(residual, pre.view(num_tokens, n), flavor))
        if layer < len(inputs["layer_output_list"]):
            out = post_reference(inputs["layer_output_list"][layer].view(1, num_tokens, hidden),
                                 residual.view(1, num_tokens, n, hidden),
                                 inputs["post_mix_list"][layer].view(1, num_tokens, n, 1),
                                 inputs["comb_mix_list"][layer].view(1, num_tokens, n, n))
            residual = out.view(num_tokens, n, hidden)
            residuals.append(residual)
    return layer_inputs, residuals


def assert_same(got: tuple, want: tuple, label: str) -> None:
    for name, got_list, want_list in zip(("layer_input", "residual"), got, want, strict=True):
        assert len(got_list) == len(want_list), f"{name} count [{label}]"
        for layer, (a, b) in enumerate(zip(got_list, want_list, strict=True)):
            assert_bitwise_equal(a, b, f"{name}[{layer}] [{label}]")


def check(hidden, tokens, layers, post_layers, *, target=None, flavor=None, n=N, chain=True, stacked=True):
    """The op against the reference, its own reference chain and, with ``chain``, the kernel chain."""
    for seed, num_tokens in enumerate(tokens):
        inputs = make_inputs(num_tokens, hidden, layers, post_layers, seed, n=n, stacked=stacked)
        outputs = make_outputs(inputs, stacked=stacked)
        got = mhc_multilayer_recompute(**inputs, **outputs, target=target, flavor=flavor)
        assert got[0] is outputs["layer_input_list"] and got[1] is outputs["residual_list"]
        label = f"T={num_tokens} n={n} H={hidden} L={layers} L_post={post_layers} {target} {flavor}"
        own_flavor = flavor or ("ascend" if target in (None, "ascend-sim") else target)
        want = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), own_flavor)
        assert_same(got, want, f"reference, {label}")
        assert_same(want, reference_chain(inputs, own_flavor), f"reference chain, {label}")
        if chain:
            assert_same(got, kernel_chain(inputs, target=target, flavor=flavor), f"kernel chain, {label}")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_the_kernel_chain(flavor):
    # The kernel chain of the cuda flavor (one more pre_apply_mix build) runs under slow: its
    # kernels equal part 1's references bit for bit (their own tests), which the reference chain
    # here stands for.
    check(HIDDEN, TOKENS, 3, 2, flavor=flavor, chain=flavor == "ascend")
    check(HIDDEN, (5,), 3, 2, flavor=flavor, chain=False, stacked=False)


def test_matches_reference_on_ascend_sim():
    # One small simulator build (a single post layer): one token, then 129 (three tiles on core 0,
    # more than its 2 buffer versions) under consumers_first and under producers_first, where a
    # missing wait between pipes shows up as wrong data.
    check(HIDDEN, (1,), 1, 1, target="ascend-sim", chain=False)
    inputs = make_inputs(129, HIDDEN, 1, 1, 1)
    want = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), "ascend")  # one for both: the cost
    for schedule in REUSE_SCHEDULES:
        with sim_schedule(schedule):
            got = mhc_multilayer_recompute(**inputs, **make_outputs(inputs), target="ascend-sim")
        assert_same(got, want, f"reference, T=129 H={HIDDEN} L=1 L_post=1 ascend-sim {schedule}")


@pytest.mark.slow
@pytest.mark.parametrize("layers,post_layers", [(1, 0), (1, 1), (2, 1), (3, 3), (10, 9), (10, 10), (16, 16)])
@pytest.mark.parametrize("flavor", FLAVORS)
def test_layer_counts(layers, post_layers, flavor):
    check(HIDDEN, (1, 37), layers, post_layers, flavor=flavor)


@pytest.mark.slow
def test_matches_the_cuda_flavor_kernel_chain():
    check(HIDDEN, (1, 70), 3, 2, flavor="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("hidden", (1, 64, 96, 1280, 7168, 8192, 8300, 16400))
def test_hidden_sizes(hidden):
    # A single column, one register, a register tail, the model sizes, one whole 8192 tile, and
    # two and three tiles with a clamped tail.
    check(hidden, (1, 37), 3, 2, flavor="ascend")


@pytest.mark.slow
@pytest.mark.parametrize("n", (1, 2, 3, 8))
def test_other_stream_counts(n):
    # mhc_post_fwd takes 1 <= n <= 8: so does this op.
    check(320, (1, 37), 3, 2, n=n, flavor="cuda")


@pytest.mark.slow
def test_many_tokens():
    check(1280, (4099,), 4, 3, flavor="ascend")


@pytest.mark.slow
@pytest.mark.parametrize("layers,post_layers,hidden", [(3, 2, HIDDEN), (2, 2, 8300), (1, 0, 96)])
def test_ascend_sim_more(layers, post_layers, hidden):
    check(hidden, (3, 67), layers, post_layers, target="ascend-sim")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    inputs = make_inputs(0, 256, 2, 2, 0)
    outputs = make_outputs(inputs)
    layer_inputs, residuals = mhc_multilayer_recompute(**inputs, **outputs)
    assert [tuple(t.shape) for t in layer_inputs] == [(0, 256)] * 2
    assert [tuple(t.shape) for t in residuals] == [(0, 4, 256)] * 2


def test_leading_dimensions_and_custom_op():
    # (B, S, ...) leading dimensions; the custom op writes the lists in place, also under fake
    # tensors (where it only validates).
    inputs = make_inputs(2 * 3, HIDDEN, 3, 2, 10)
    shaped = {name: ([t.view(2, 3, *t.shape[1:]) for t in value] if isinstance(value, list)
                     else value.view(2, 3, *value.shape[1:])) for name, value in inputs.items()}
    outputs = make_outputs(inputs)
    shaped_outputs = {name: [t.view(2, 3, *t.shape[1:]) for t in value] for name, value in outputs.items()}
    torch.ops.vmi.mhc_multilayer_recompute(*shaped.values(), *shaped_outputs.values())
    want = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), "ascend")
    assert_same((outputs["layer_input_list"], outputs["residual_list"]), want, "custom op")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = {name: ([mode.from_tensor(t) for t in value] if isinstance(value, list) else mode.from_tensor(value))
                for name, value in {**shaped, **shaped_outputs}.items()}
        assert torch.ops.vmi.mhc_multilayer_recompute(*fake.values()) is None


def test_torch_target_and_parallel_entry_point():
    inputs = make_inputs(4, HIDDEN, 3, 2, 20)
    want = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), "cuda")
    for run, target in ((mhc_multilayer_recompute, "torch"), (mhc_multilayer_recompute_parallel, None)):
        outputs = make_outputs(inputs)
        assert_same(run(**inputs, **outputs, target=target, flavor="cuda"), want, f"{run.__name__} [{target}]")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_multilayer_recompute_parallel(**inputs, **make_outputs(inputs), target="torch")


def test_non_finite_values_propagate():
    # NaN in R_0 (token 1, stream 2, column 7), +inf in layer 0's output (token 3, column 999: the
    # register tail), NaN in layer 1's comb[0, 3] (token 5): IEEE propagation through the later
    # layers, as the kernel chain has it (NaN payloads aside).
    inputs = make_inputs(8, HIDDEN, 3, 2, 30)
    inputs["initial_residual"][1, 2, 7] = float("nan")
    inputs["layer_output_list"][0][3, 999] = float("inf")
    inputs["comb_mix_list"][1][5, 0, 3] = float("nan")
    outputs = make_outputs(inputs)
    layer_inputs, residuals = mhc_multilayer_recompute(**inputs, **outputs, flavor="ascend")
    want = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), "ascend")
    for name, got_list, want_list in zip(("layer_input", "residual"), (layer_inputs, residuals), want, strict=True):
        for layer, (a, b) in enumerate(zip(got_list, want_list, strict=True)):
            assert_bitwise_equal(a, b, f"{name}[{layer}]", any_nan=True)
    assert layer_inputs[0][1, 7].isnan() and residuals[0][1, :, 7].isnan().all()
    assert not residuals[0][3, :, 999].float().isfinite().any()
    assert not residuals[1][5, 3].float().isfinite().any() and layer_inputs[2][5].isnan().any()
    finite = [t for t in range(8) if t not in (1, 3, 5)]
    assert all(r[finite].float().isfinite().all() for r in residuals)


def test_reference_against_float64():
    # Per layer, from the residual the previous layer carries: the layer input's fp32 chain has n
    # roundings (a product and n - 1 fused multiply-adds), the residual update's n + 1 (a product
    # and n fmas); each adds at most 2^-24 of the running magnitude, bounded by the sum of the
    # terms' magnitudes; the bf16 rounding adds half an ulp (2^-8 relative at most).
    inputs = make_inputs(16, 1280, 4, 3, 40)
    layer_inputs, residuals = reference.mhc_multilayer_recompute(*(inputs[k] for k in INPUTS), "ascend")
    carried = [inputs["initial_residual"]] + residuals
    exact_inputs, exact_residuals = reference.multilayer_recompute_exact(carried, *(inputs[k] for k in INPUTS[1:]))
    for layer, (got, exact) in enumerate(zip(layer_inputs, exact_inputs, strict=True)):
        terms = (inputs["pre_mix_list"][layer].double().abs() * carried[layer].double().abs()).sum(dim=1)
        chain = N * 2.0**-24 * terms
        assert ((got.double() - exact).abs() <= 2.0**-8 * (exact.abs() + chain) + chain).all(), f"input {layer}"
    for layer, (got, exact) in enumerate(zip(residuals, exact_residuals, strict=True)):
        terms = (inputs["post_mix_list"][layer].double().abs().unsqueeze(-1)
                 * inputs["layer_output_list"][layer].double().abs().unsqueeze(1)
                 + torch.einsum("tio,tih->toh", inputs["comb_mix_list"][layer].double().abs(),
                                carried[layer].double().abs()))
        chain = (N + 1) * 2.0**-24 * terms
        assert ((got.double() - exact).abs() <= 2.0**-8 * (exact.abs() + chain) + chain).all(), f"residual {layer}"
