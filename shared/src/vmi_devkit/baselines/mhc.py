"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.bench import Baseline, in_row_chunks


def _sinkhorn_steps(logits, repeat: int, eps: float):
    """torch's softmax and sums (its own order and exp): the output and every step's input and
    denominator."""
    p = torch.softmax(logits, dim=-1)
    inputs, dens = [p], [None]
    x = p + eps
    for step in range(1, 2 * repeat):
        den = x.sum(dim=-2 if step % 2 else -1, keepdim=True) + eps
        inputs.append(x)
        dens.append(den)
        x = x / den
    return x, inputs, dens


def mhc_sinkhorn_fwd_baseline(op, options):
    repeat, eps = options["repeat"], float(options["eps"])

    def run(inputs, flavor, rows):
        x = inputs["comb_res_mix"]
        return (in_row_chunks(lambda a, b: _sinkhorn_steps(x[a:b], repeat, eps)[0], x.shape[0], rows),)
    return Baseline(run, "torch ops in fp32: softmax, then x / (x.sum(dim) + eps) alternating columns and rows",
                    same_bits=False)


def mhc_sinkhorn_bwd_baseline(op, options):
    repeat, eps = options["repeat"], float(options["eps"])

    def one(grad, logits):
        _, inputs, dens = _sinkhorn_steps(logits, repeat, eps)
        for step in range(2 * repeat - 1, 0, -1):
            dim = -2 if step % 2 else -1
            grad = (grad - (grad * inputs[step]).sum(dim=dim, keepdim=True) / dens[step]) / dens[step]
        p = inputs[0]
        return (grad - (grad * p).sum(dim=-1, keepdim=True)) * p

    def run(inputs, flavor, rows):
        g, x = inputs["grad_output"], inputs["x"]
        return (in_row_chunks(lambda a, b: one(g[a:b], x[a:b]), x.shape[0], rows),)
    return Baseline(run, "torch ops in fp32: the forward's steps recomputed with softmax and sums, then walked "
                         "back", same_bits=False)


BASELINES = {
    "mhc_sinkhorn_fwd": mhc_sinkhorn_fwd_baseline,
    "mhc_sinkhorn_bwd": mhc_sinkhorn_bwd_baseline,
}
