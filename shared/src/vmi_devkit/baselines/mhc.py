"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.bench import Baseline, in_row_chunks


def mhc_post_fwd_baseline(op, options):
    def one(x, residual, post, comb):
        # comb[i, o] mixes input stream i into output stream o: comb^T @ residual.
        mixed = torch.matmul(comb.transpose(-1, -2), residual.float())
        return torch.addcmul(mixed, post, x.float().unsqueeze(-2)).bfloat16()

    def run(inputs, flavor, rows):
        x, residual, post, comb = (inputs[k] for k in ("x", "residual", "post_layer_mix", "comb_res_mix"))
        return (in_row_chunks(lambda a, b: one(x[a:b], residual[a:b], post[a:b], comb[a:b]), x.shape[0], rows),)
    # torch's matmul sums in its own order, not the kernel's fma chain: the last bit may differ.
    return Baseline(run, "torch ops: matmul(comb^T, residual) + post * x in fp32, to bf16", same_bits=False)


def mhc_post_bwd_baseline(op, options):
    def one(x, residual, post, comb, d_o):
        grad = d_o.float()
        d_x = torch.matmul(post.transpose(-1, -2), grad).squeeze(-2)
        d_residual = torch.matmul(comb, grad)
        d_post = torch.matmul(grad, x.float().unsqueeze(-1))
        d_comb = torch.matmul(residual.float(), grad.transpose(-1, -2))
        return d_x.bfloat16(), d_residual.bfloat16(), d_post, d_comb

    def run(inputs, flavor, rows):
        names = ("x", "residual", "post_layer_mix", "comb_res_mix", "d_o")
        x, residual, post, comb, d_o = (inputs[k] for k in names)
        return in_row_chunks(lambda a, b: one(x[a:b], residual[a:b], post[a:b], comb[a:b], d_o[a:b]),
                             x.shape[0], rows)
    # matmul's summation order over H and over the streams is torch's, not vmi's lane order.
    return Baseline(run, "torch ops: matmul(post^T, d_o), matmul(comb, d_o), matmul(d_o, x), matmul(res, d_o^T) "
                         "in fp32", same_bits=False)


BASELINES = {
    "mhc_post_fwd": mhc_post_fwd_baseline,
    "mhc_post_bwd": mhc_post_bwd_baseline,
}
