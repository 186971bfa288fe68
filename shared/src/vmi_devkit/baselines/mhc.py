"""Speed baselines of vmi-mhc's ops for ``vmi bench``: the fastest straightforward torch
composition of each op (broadcasts, ``einsum``/``matmul`` and sums in fp32), in the structure of
the op's ``run`` outputs."""

from __future__ import annotations

import torch

from vmi_core.tools.bench import Baseline, in_row_chunks
from vmi_mhc.ops.demo import NORM_EPS

# The vmi command runs pre_split_mixes with TileKernels' test values (vmi_mhc.ops.demo).
POST_MULT = 2.0
PRE_EPS = 1e-2
N = 4


def _gains(scale):
    """The per-entry gain vector (4 pre, 4 post, 16 comb entries)."""
    return torch.cat([scale[0].expand(N), scale[1].expand(N), scale[2].expand(N * N)])


def mhc_pre_split_mixes_fwd_baseline(op, options):
    def one(x, gains, base):
        z = x * gains + base
        return torch.sigmoid(z[:, :N]) + PRE_EPS, torch.sigmoid(z[:, N:2 * N]) * POST_MULT, z[:, 2 * N:].contiguous()

    def run(inputs, flavor, rows):
        x, gains, base = inputs["input_mixes"], _gains(inputs["mhc_scale"]), inputs["mhc_base"]
        return in_row_chunks(lambda a, b: one(x[a:b], gains, base), x.shape[0], rows)
    return Baseline(run, "torch ops in fp32: z = x * gains + base, sigmoid(z) + eps, sigmoid(z) * m",
                    same_bits=False)


def mhc_pre_split_mixes_bwd_baseline(op, options):
    def run(inputs, flavor, rows):
        x, scale = inputs["input_mixes"], inputs["mhc_scale"]
        gains = _gains(scale)
        s = torch.sigmoid(x[:, :N] * gains[:N] + inputs["mhc_base"][:N])
        p = inputs["post_layer_mix"]
        gz = torch.cat([inputs["pre_layer_mix_grad"] * s * (1 - s),
                        inputs["post_layer_mix_grad"] * p * (1 - p / POST_MULT), inputs["comb_res_mix_grad"]], dim=1)
        products = (gz * x).sum(0)
        scale_grad = torch.stack([products[:N].sum(), products[N:2 * N].sum(), products[2 * N:].sum()])
        return gz * gains, scale_grad, gz.sum(0)
    return Baseline(run, "torch ops in fp32: sigmoid recomputed, gz * gains, (gz * x) and gz summed over tokens",
                    same_bits=False, chunks=False)


# --- head_compute_mix ---

def mhc_head_compute_mix_fwd_baseline(op, options):
    def run(inputs, flavor, rows):
        x, scale, base = inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"]
        return in_row_chunks(lambda a, b: (torch.sigmoid(x[a:b] * scale + base) + PRE_EPS,), x.shape[0], rows)
    return Baseline(run, "torch ops in fp32: sigmoid(x * scale + base) + eps", same_bits=False)


def mhc_head_compute_mix_bwd_baseline(op, options):
    num_rows = options["num_sms"]

    def run(inputs, flavor, rows):
        x, scale = inputs["input_mix"], inputs["mhc_scale"]
        num_tokens, n = x.shape
        s = torch.sigmoid(x * scale + inputs["mhc_base"])
        gz = inputs["output_mix_grad"] * s * (1 - s)
        # The partial rows' token ranges (64-token tiles, consecutive tiles per row), zero-padded.
        num_tiles = -(-num_tokens // 64)
        span = 64 * max(1, -(-num_tiles // num_rows))
        padded = torch.zeros(num_rows * span, n + 1, device=x.device)
        padded[:num_tokens, :n] = gz
        padded[:num_tokens, n] = (gz * x).sum(1)
        sums = padded.view(num_rows, span, n + 1).sum(1)
        return gz * scale, sums[:, n:].contiguous(), sums[:, :n].contiguous()
    return Baseline(run, "torch ops in fp32: sigmoid recomputed, gz * scale, gz and (gz * x) summed per row's tokens",
                    same_bits=False, chunks=False)


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


# --- pre_big_fuse (the vmi command runs it with TileKernels' test values) ---

def mhc_pre_big_fuse_fwd_baseline(op, options):
    eps, repeat = 1e-6, 10

    def one(partials, sqrsums, gains, base, residual):
        group_size = N * residual.shape[-1]
        mixes = partials.sum(0) * torch.rsqrt(sqrsums.sum(0) / group_size + NORM_EPS).unsqueeze(-1)
        z = mixes * gains + base
        pre = torch.sigmoid(z[:, :N]) + eps
        comb = _sinkhorn_steps(z[:, 2 * N:].view(-1, N, N), repeat, eps)[0]
        layer_input = torch.matmul(pre.unsqueeze(1), residual.float()).squeeze(1).to(torch.bfloat16)
        return torch.sigmoid(z[:, N:2 * N]) * POST_MULT, comb.view(-1, N * N), layer_input

    def run(inputs, flavor, rows):
        partials, sqrsums, residual = inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["residual"]
        gains, base = _gains(inputs["mhc_scale"]), inputs["mhc_base"]
        return in_row_chunks(lambda a, b: one(partials[:, a:b], sqrsums[:, a:b], gains, base, residual[a:b]),
                             residual.shape[0], rows)
    return Baseline(run, "the unfused chain in torch ops (fp32): partial sums and rsqrt, sigmoid, Sinkhorn with "
                         "softmax and sums, matmul(pre, residual)", same_bits=False)


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


def mhc_multilayer_recompute_baseline(op, options):
    def one(residual, pres, outputs, posts, combs):
        layer_inputs, residuals = [], []
        for layer, pre in enumerate(pres):
            streams = residual.float()
            layer_inputs.append(torch.matmul(pre.transpose(-1, -2), streams).squeeze(-2).bfloat16())
            if layer < len(outputs):
                mixed = torch.matmul(combs[layer].transpose(-1, -2), streams)
                residual = torch.addcmul(mixed, posts[layer], outputs[layer].float().unsqueeze(-2)).bfloat16()
                residuals.append(residual)
        return (*layer_inputs, *residuals)

    def run(inputs, flavor, rows):
        residual = inputs["initial_residual"]
        lists = [inputs[k] for k in ("pre_mix_list", "layer_output_list", "post_mix_list", "comb_mix_list")]
        return in_row_chunks(lambda a, b: one(residual[a:b], *([t[a:b] for t in ts] for ts in lists)),
                             residual.shape[0], rows)
    # torch's matmul sums in its own order, not the kernels' fma chains: the last bit may differ, and
    # a difference carried in the residual reaches the later layers.
    return Baseline(run, "per layer torch ops: matmul(pre^T, R), matmul(comb^T, R) + post * x in fp32, to bf16",
                    same_bits=False)


BASELINES = {
    "mhc_head_compute_mix_fwd": mhc_head_compute_mix_fwd_baseline,
    "mhc_head_compute_mix_bwd": mhc_head_compute_mix_bwd_baseline,
    "mhc_pre_split_mixes_fwd": mhc_pre_split_mixes_fwd_baseline,
    "mhc_pre_split_mixes_bwd": mhc_pre_split_mixes_bwd_baseline,
    "mhc_fn_normw_merge_fwd": fn_normw_merge_fwd_baseline,
    "mhc_fn_normw_merge_bwd": fn_normw_merge_bwd_baseline,
    "mhc_reduce_partials_and_rmsnorm_fwd": reduce_partials_and_rmsnorm_fwd_baseline,
    "mhc_reduce_partials_and_rmsnorm_bwd": reduce_partials_and_rmsnorm_bwd_baseline,
    "mhc_sinkhorn_fwd": mhc_sinkhorn_fwd_baseline,
    "mhc_sinkhorn_bwd": mhc_sinkhorn_bwd_baseline,
    "mhc_pre_big_fuse_fwd": mhc_pre_big_fuse_fwd_baseline,
    "mhc_pre_norm_fn_gemm_fwd": pre_norm_fn_gemm_fwd_baseline,
    "mhc_pre_norm_fn_gemm_bwd": pre_norm_fn_gemm_bwd_baseline,
    "expand_to_mhc_fwd": expand_fwd_baseline,
    "expand_to_mhc_bwd": expand_bwd_baseline,
    "mhc_pre_apply_mix_fwd": pre_apply_mix_fwd_baseline,
    "mhc_pre_apply_mix_bwd": pre_apply_mix_bwd_baseline,
    "mhc_post_fwd": mhc_post_fwd_baseline,
    "mhc_post_bwd": mhc_post_bwd_baseline,
    "mhc_multilayer_recompute": mhc_multilayer_recompute_baseline,
}
