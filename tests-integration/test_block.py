"""The DeepSeek-V4-style block of ``vmi.block`` across vmi-quant, vmi-moe and vmi-mhc.

* Forward, cpu kernels against the references (the same public functions on target ``"torch"``):
  every stage bit for bit (the gate's scores too: both sides evaluate the correctly rounded
  exp/log1p in the same fp32 order).
* Gradients, kernels against the references: within the bound that the gate backward's
  float64-reference tolerance composes to (derived at the test).
* Backward: every gradient of the kernel block against torch autograd through the float64 block
  (same routing, E4M3 casts in both), within a bound derived from the E4M3 step; and the gradient of
  the sequence-level balance loss alone, whose frequencies are vmi-moe's ``aux_fi``.
* ``vmi demo`` prints the table and the errors.

The expert-parallel block is tested in ``test_block_ep.py``. Marked ``block`` (``nox -s
integration``) and ``slow``: its first run compiles about twenty cpu kernels, more than the default
run's budget allows.
"""

from __future__ import annotations

import pytest
import torch

import vmi_moe
from vmi.block import (
    BlockConfig,
    Kernels,
    expert_frequencies,
    float64_errors,
    make_params,
    relative_error,
    run_block,
)
from vmi_core.tools.testing import assert_bitwise_equal

pytestmark = [pytest.mark.block, pytest.mark.slow]

CONFIG = BlockConfig()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The block's torch ops are tiny: one thread, as the expert-parallel ranks and the demo run them
    (a busy machine's cores make a second thread wait)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_block_forward_and_backward():
    """One run of each implementation (the first compiles the kernels: one test, so that one worker
    compiles them while another runs the expert-parallel test)."""
    runs = {}
    for ops in (Kernels("cpu"), Kernels("torch")):
        p = make_params(CONFIG, seed=0).fresh()
        run = run_block(ops, p, CONFIG)
        run.loss.backward()
        runs[ops.target] = (run, p)
    check_forward_matches_the_references(runs["cpu"][0], runs["torch"][0])
    check_gradients_match_the_reference_gradients(runs["cpu"][1], runs["torch"][1])
    check_gradients_match_float64_autograd(*runs["cpu"])
    check_balance_frequencies_are_aux_fi(runs["cpu"][0])
    check_balance_gradient_matches_float64_autograd()


def check_forward_matches_the_references(kernel, reference):
    # Up to the gate's logits every stage's kernel computes the reference's fixed fp32 chain:
    # expand is a copy, mhc_pre's chain (prenorm GEMM, RMS, split, Sinkhorn, apply) and RMSNorm + E4M3
    # have one summation order on every target, the gate GEMM is the same torch call.
    for name in ("residual", "layer_input", "post_mix", "comb_mix", "normed", "logits"):
        assert_bitwise_equal(kernel.stages[name], reference.stages[name], name)
    # The gate's scores: the correctly rounded exp/log1p in the flavor's fp32 order on both sides
    # (docs/moe), so the routing and its weights, and everything after them, are the same bits.
    assert_bitwise_equal(kernel.topk_idx, reference.topk_idx, "topk_idx")
    assert_bitwise_equal(kernel.topk_weights, reference.topk_weights, "topk_weights")
    assert_bitwise_equal(kernel.layer_output, reference.layer_output, "layer_output")
    assert_bitwise_equal(kernel.head, reference.head, "head")


def check_gradients_match_the_reference_gradients(kernel, reference):
    """The gate backward's kernel is checked against a float64 reference within rtol 1e-5 (docs/moe),
    so the logits' gradient and what it reaches (the gate weight's gradient, the gradients flowing
    back into the layer input) may move by that much relative: a moved fp32 value crosses a bf16
    rounding midpoint at most once, one bf16 ulp (2^-8 relative), and the mHC pre and expand
    backward are linear in it with bit-identical mixes: normwise 2^-8 plus their own bf16 rounding
    of a moved sum, 2^-8."""
    for name, grad in kernel.grads().items():
        assert relative_error(grad, reference.grads()[name]) <= 2**-7, name


def check_gradients_match_float64_autograd(run, p):
    """Every gradient of the kernel block against torch autograd through the float64 block.

    The float64 block quantizes the same two tensors to E4M3 (its own scales) and takes the kernel
    run's routing. The two differ by the bf16/TF32 roundings of the kernels (2^-8 relative at most
    per stage) and, where such a difference moves a value across an E4M3 rounding midpoint, by one
    E4M3 step (2^-3 relative) of that element: about 2^-8 / 2^-3 = 1/32 of the elements. A GEMM
    over such operands sums these moves with random signs; normwise they stay well under one half
    step, 2^-4: measured up to 0.05 (the up-projection weight's gradient, which multiplies two moved
    operands). Bound: 2^-3, one E4M3 step, the largest error of a single element.
    """
    errors = float64_errors(run, p, CONFIG)
    assert set(errors) == {"head"} | {f"d {name}" for name in p.GRADIENTS}
    for name, error in errors.items():
        assert error <= 2**-3, (name, error)


def check_balance_frequencies_are_aux_fi(run):
    """The balance loss's f of each sequence, from its routing counts, is vmi-moe's ``aux_fi`` of
    the sequence's routing (bit for bit); and the block's scores sums are the gate's: each sequence's
    shares of u sum to its token count L, up to rounding. Each share ``u / Σu`` is off by at most
    E - 1 additions and one division (one 2^-24 relative each), the gate adds L of them per expert and
    this test the E experts: relative error at most (2E + L)·2^-24."""
    length = CONFIG.sequence_length
    for s in range(CONFIG.num_sequences):
        fi = vmi_moe.aux_fi(run.topk_idx[s * length:(s + 1) * length].contiguous(), CONFIG.num_experts,
                            CONFIG.num_topk)
        assert_bitwise_equal(expert_frequencies(run.stages["counts"][s], CONFIG), fi, f"f of sequence {s}")
    sums = run.stages["scores_sum"].sum(dim=1)
    bound = (2 * CONFIG.num_experts + length) * 2**-24
    assert torch.allclose(sums, torch.full_like(sums, float(length)), rtol=bound, atol=0)


def check_balance_gradient_matches_float64_autograd():
    """The balance loss alone (probe 0, so the head output contributes nothing): its gradient goes
    through the gate's backward kernel (the auxiliary term) to the logits, the gate weight, the norm
    and the input. That path casts nothing to E4M3; it carries bf16 tensors (norm output, layer
    input, their gradients: 2^-8 relative each), so normwise a few 2^-8: bound 2^-6. The mHC
    parameters get no gradient in exact arithmetic (RMSNorm is scale invariant and the four
    streams start equal), only rounding noise: not compared."""
    p = make_params(CONFIG, seed=0)
    p.probe.zero_()
    p = p.fresh()
    run = run_block(Kernels("cpu"), p, CONFIG)
    run.loss.backward()
    assert torch.equal(run.loss, run.balance_loss)
    errors = float64_errors(run, p, CONFIG)
    for name in ("d x", "d norm_weight", "d gate_weight"):
        assert errors[name] <= 2**-6, (name, errors[name])


def test_demo_prints_the_stage_table_and_errors(capsys, vmi_env):
    from vmi.demo import main
    from vmi_core.environment import THREADS_ENV

    vmi_env.setenv(THREADS_ENV, "1")  # restored afterwards: the demo sets it for its process
    assert main(["--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for stage in ("expand_to_mhc", "mhc_pre", "RMSNorm + E4M3 cast", "moe_topk_gate", "routing layout", "dispatch",
                  "SwiGLU + E4M3 cast", "combine", "mhc_post", "mhc_head", "block (forward + backward)"):
        assert stage in out, stage
    assert "max error against the float64 block" in out
    assert out.count("gradients up to") == 2
