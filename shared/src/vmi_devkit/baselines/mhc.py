"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.bench import Baseline
from vmi_mhc.ops import NORM_EPS

# --- norm_fn ---

def fn_normw_merge_fwd_baseline(op, options):
    def run(inputs, flavor, rows):
        return (inputs["fn"] * inputs["normw"],)
    return Baseline(run, "fn * normw", chunks=False)


def fn_normw_merge_bwd_baseline(op, options):
    def run(inputs, flavor, rows):
        g = inputs["out_fn_grad"]
        return inputs["fn_grad"] + g * inputs["normw"], inputs["normw_grad"] + (g * inputs["fn"]).sum(0)
    return Baseline(run, "fn_grad + g * normw, normw_grad + (g * fn).sum(0) (no fused multiply-add)",
                    same_bits=False, chunks=False)


def reduce_partials_and_rmsnorm_fwd_baseline(op, options):
    def run(inputs, flavor, rows):
        out_mul = inputs["out_mul_splitted"].sum(0)
        sqrsum = inputs["sqrsum_splitted"].sum(0)
        r = torch.rsqrt(sqrsum / inputs["rms_group_size"] + NORM_EPS)
        return out_mul, sqrsum, (out_mul * r.unsqueeze(-1))[:, 0]
    return Baseline(run, "partials.sum(0), rsqrt(sqrsum / K + eps), out_mul * r", same_bits=False, chunks=False)


def reduce_partials_and_rmsnorm_bwd_baseline(op, options):
    def run(inputs, flavor, rows):
        group_size = inputs["rms_group_size"]
        g, out_mul, sqrsum = inputs["out_grad"].unsqueeze(1), inputs["out_mul"], inputs["sqrsum"]
        r = torch.rsqrt(sqrsum / group_size + NORM_EPS)
        dot = (g * out_mul).sum(-1)
        return g * r.unsqueeze(-1), dot * r / (sqrsum + NORM_EPS * group_size) / -2
    return Baseline(run, "g * r, (g * out_mul).sum(-1) * r / (sqrsum + eps * K) / -2", same_bits=False,
                    chunks=False)


BASELINES = {
    "mhc_fn_normw_merge_fwd": fn_normw_merge_fwd_baseline,
    "mhc_fn_normw_merge_bwd": fn_normw_merge_bwd_baseline,
    "mhc_reduce_partials_and_rmsnorm_fwd": reduce_partials_and_rmsnorm_fwd_baseline,
    "mhc_reduce_partials_and_rmsnorm_bwd": reduce_partials_and_rmsnorm_bwd_baseline,
}
