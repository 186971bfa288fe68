"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.bench import Baseline

# --- the prenorm GEMM of norm_fn ---

def pre_norm_fn_gemm_fwd_baseline(op, options):
    n_splits = options["n_splits"]

    def run(inputs, flavor, rows):
        x, fn = inputs["x"], inputs["fn"]
        xs = x.float().view(x.shape[0], n_splits, -1).transpose(0, 1)
        return (torch.bmm(xs, fn.view(fn.shape[0], n_splits, -1).permute(1, 2, 0)),
                xs.square().sum(-1))
    return Baseline(run, "torch ops in fp32: per split bmm(x, fnᵀ) and x.square().sum(-1), no TF32 rounding",
                    same_bits=False, chunks=False)


def pre_norm_fn_gemm_bwd_baseline(op, options):
    def run(inputs, flavor, rows):
        x, d = inputs["x"].float(), inputs["out_mul_grad"]
        x_grad = inputs["x_grad"].clone()
        x_grad.copy_(x_grad.float() + d @ inputs["fn"] + 2 * x * inputs["sqrsum_grad"][:, None])
        return d.T @ x, x_grad
    return Baseline(run, "torch ops in fp32: x_grad + d @ fn + 2·x·d_sqrsum, dᵀ @ x, no TF32 rounding",
                    same_bits=False, chunks=False)


BASELINES = {
    "mhc_pre_norm_fn_gemm_fwd": pre_norm_fn_gemm_fwd_baseline,
    "mhc_pre_norm_fn_gemm_bwd": pre_norm_fn_gemm_bwd_baseline,
}
