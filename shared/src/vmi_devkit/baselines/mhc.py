"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.bench import Baseline, in_row_chunks

# --- expand ---

def expand_fwd_baseline(op, options):
    n = options["mhc_mult"]

    def run(inputs, flavor, rows):
        x = inputs["x"]
        return (in_row_chunks(lambda a, b: x[a:b].unsqueeze(1).expand(b - a, n, x.shape[1]).contiguous(),
                              x.shape[0], rows),)
    return Baseline(run, "x.unsqueeze(1).expand(T, n, H).contiguous()")


def expand_bwd_baseline(op, options):
    def run(inputs, flavor, rows):
        o_grad = inputs["o_grad"]
        return (in_row_chunks(lambda a, b: o_grad[a:b].float().sum(1).to(torch.bfloat16), o_grad.shape[0], rows),)
    # torch's sum over the streams may add in another order than stream 0, 1, 2, ... (last bits).
    return Baseline(run, "o_grad.float().sum(1).to(bfloat16)", same_bits=False)


# --- pre_apply_mix ---

def pre_apply_mix_fwd_baseline(op, options):
    def one(x, mix):
        return torch.matmul(mix.unsqueeze(1), x.float()).squeeze(1).to(torch.bfloat16)

    def run(inputs, flavor, rows):
        x, mix = inputs["x"], inputs["mix"]
        return (in_row_chunks(lambda a, b: one(x[a:b], mix[a:b]), x.shape[0], rows),)
    # Batched matmul in fp32 without the fused chain of the reference: last-bit differences.
    return Baseline(run, "torch.matmul(mix[:, None], x.float()).to(bfloat16)", same_bits=False)


def pre_apply_mix_bwd_baseline(op, options):
    def one(o_grad, x, mix, x_grad):
        og = o_grad.float().unsqueeze(1)
        mix_grad = torch.matmul(x.float(), og.transpose(1, 2)).squeeze(-1)
        return mix_grad, (x_grad.float() + mix.unsqueeze(-1) * og).to(torch.bfloat16)

    def run(inputs, flavor, rows):
        o_grad, x, mix, x_grad = inputs["o_grad"], inputs["x"], inputs["mix"], inputs["x_grad"]
        return in_row_chunks(lambda a, b: one(o_grad[a:b], x[a:b], mix[a:b], x_grad[a:b]), x.shape[0], rows)
    # torch's matmul order over H and an unfused multiply-add: last-bit differences.
    return Baseline(run, "torch.matmul(x.float(), o_grad[:, :, None]), (x_grad.float() + mix * o_grad).to(bfloat16)",
                    same_bits=False)


BASELINES = {
    "expand_to_mhc_fwd": expand_fwd_baseline,
    "expand_to_mhc_bwd": expand_bwd_baseline,
    "mhc_pre_apply_mix_fwd": pre_apply_mix_fwd_baseline,
    "mhc_pre_apply_mix_bwd": pre_apply_mix_bwd_baseline,
}
