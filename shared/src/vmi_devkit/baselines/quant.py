"""Speed baselines of vmi-quant's ops for ``vmi bench``: the straightforward torch composition
of each op (native torch ops, no bit-level emulation), in the structure of the op's ``run`` outputs.

E4M3 is torch's ``float8_e4m3fn`` conversion; E2M1, which torch cannot convert to, is rounded with
seven comparisons against the midpoints of its grid and packed two nibbles a byte. Options a
baseline does not model (stochastic rounding) fall back to the reference in row chunks.
"""

from __future__ import annotations

import torch

from vmi_core.targets import get_flavor
from vmi_core.tools.bench import Baseline, chunked_reference, in_row_chunks
from vmi_quant.config import get_amax_clamp_for_quant, get_token_alignment
from vmi_quant.inputs import expert_rows
from vmi_quant.ops.norm_forward import NORM_EPS

_Q = {"e4m3": 448.0, "e2m1": 6.0}
_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring E2M1 magnitudes; a tie rounds to the even code, i.e. down at 0.25, 1.25,
# 2.5 and 5 and up at 0.75, 1.75 and 3.5. ``|y| > t`` counts a code step, with the up-ties moved one
# fp32 ulp down so that the tie itself counts.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIE_UP = (False, True, False, True, False, True, False)


def _e2m1_thresholds() -> list[float]:
    mid = torch.tensor(_E2M1_MIDPOINTS)
    below = torch.nextafter(mid, torch.zeros_like(mid))
    return torch.where(torch.tensor(_E2M1_TIE_UP), below, mid).tolist()


_E2M1_THRESHOLDS = _e2m1_thresholds()


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Nibble codes (uint8, sign in bit 3) of fp32 ``y`` rounded to E2M1 (RNE, saturating at 6)."""
    a = y.abs()
    code = (a > _E2M1_THRESHOLDS[0]).to(torch.uint8)
    for t in _E2M1_THRESHOLDS[1:]:
        code += a > t
    return code | (y.signbit().to(torch.uint8) << 3)


def e2m1_pack(codes: torch.Tensor) -> torch.Tensor:
    """Two nibbles a byte, element 2j in the low nibble, as int8."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(torch.int8)


def e2m1_values() -> torch.Tensor:
    """fp32 value of each of the 16 nibble codes."""
    grid = torch.tensor(_E2M1_GRID)
    return torch.cat([grid, -grid])


def e2m1_unpack_values(packed: torch.Tensor) -> torch.Tensor:
    """fp32 values of packed FP4 bytes ``(..., n)`` -> ``(..., 2n)``: one lookup in a 256-entry table
    of byte -> (low, high) values."""
    table = torch.stack([e2m1_values().repeat(16), e2m1_values().repeat_interleave(16)], dim=1)
    return table[packed.view(torch.uint8).int()].flatten(-2)


def _encode(y: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "e4m3":
        return y.to(torch.float8_e4m3fn)
    return e2m1_pack(e2m1_codes(y))


def _scales(amax: torch.Tensor, fmt: str, round_sf: bool, use_e4m3_sf: bool):
    """(stored SF, the decoded SF, quantization multiplier) from the block amax (fp32)."""
    c = amax.clamp_min(get_amax_clamp_for_quant(fmt, use_e4m3_sf))
    q = torch.full_like(c, _Q[fmt])
    if round_sf:
        # Power-of-two ceiling of c / Q: round the exponent up unless the mantissa is zero.
        sf = (((c / q).view(torch.int32) + 0x7FFFFF) & 0x7F800000).view(torch.float32)
        return sf, sf, torch.ones_like(sf) / sf
    if use_e4m3_sf:
        stored = (c / q).to(torch.float8_e4m3fn)
        sf = stored.float()
        return stored, sf, torch.ones_like(sf) / sf
    return c / q, c / q, q / c


def pack_ue8m0(sf: torch.Tensor, pack: int, dim: int) -> torch.Tensor:
    """Power-of-two fp32 SF grid -> little-endian words of ``pack`` exponent bytes along ``dim``."""
    exps = (sf.view(torch.int32) >> 23).to(torch.uint8)
    if dim == 0:
        exps = exps.T
    rows, cols = exps.shape
    words = -(-cols // pack)
    if words * pack != cols:
        exps = torch.nn.functional.pad(exps, (0, words * pack - cols))
    out = exps.contiguous().view(torch.int16 if pack == 2 else torch.int32)
    return out.T.contiguous() if dim == 0 else out


def col_major(sf: torch.Tensor, align_bytes: int) -> torch.Tensor:
    """``sf`` stored column-major, each storage row padded to ``align_bytes``."""
    rows, cols = sf.shape
    align = max(1, align_bytes // sf.element_size())
    storage = torch.empty((cols, -(-rows // align) * align), dtype=sf.dtype)
    storage[:, :rows].copy_(sf.T)
    return storage[:, :rows].T


def _layout(sf: torch.Tensor, packed: bool, col: bool, flavor: str, pack_dim: int = 1) -> torch.Tensor:
    flavor = get_flavor(flavor)
    if packed:
        sf = pack_ue8m0(sf, flavor.ue8m0_pack, pack_dim)
    return col_major(sf, flavor.col_major_align_bytes) if col else sf


def _block_quant(x: torch.Tensor, fmt: str, bm: int, bk: int, round_sf: bool, use_e4m3_sf: bool):
    """``(data, stored SF grid, decoded SF grid)`` of ``x`` (M, K) with M % bm == 0 and K % bk == 0."""
    m, k = x.shape
    xf = x.float().view(m // bm, bm, k // bk, bk)
    amax = xf.abs().amax(dim=(1, 3)) if bm > 1 else xf.abs().amax(dim=3).view(m, k // bk)
    stored, sf, mult = _scales(amax, fmt, round_sf, use_e4m3_sf)
    y = xf * mult.view(m // bm, 1, k // bk, 1)
    return _encode(y.view(m, k), fmt), stored, sf


def _rows(inputs) -> int:
    return inputs["x"].shape[0]


def _slice_x(inputs, start, stop):
    return {"x": inputs["x"][start:stop]}


# --- per_token_cast / per_block_cast ---

def _block_cast_baseline(options, block, what):
    fmt = options["fmt"]
    round_sf = options.get("round_sf", False)
    use_e4m3_sf = options.get("use_e4m3_sf", False)
    packed, col = options["use_packed_ue8m0"], options["use_tma_aligned_col_major_sf"]

    def run(inputs, flavor, rows):
        x = inputs["x"]
        if x.shape[0] % block[0] or x.shape[1] % block[1]:
            raise ValueError(f"the baseline needs rows and columns that are multiples of the block {block}")
        data, stored = in_row_chunks(lambda a, b: _block_quant(x[a:b], fmt, *block, round_sf, use_e4m3_sf)[:2],
                                     x.shape[0], rows)
        return data, _layout(stored, packed, col, flavor)
    return Baseline(run, what)


def per_token_cast_baseline(op, options):
    if options["stochastic_cast"]:
        return chunked_reference(lambda inputs, flavor: op.reference(inputs, options, flavor), _slice_x, _rows,
                                 "stochastic_cast not modelled")
    npc, fmt = options["num_per_channels"], options["fmt"]
    encode = ".to(float8_e4m3fn)" if fmt == "e4m3" else "E2M1 by comparisons, packed"
    return _block_cast_baseline(options, (1, npc),
                                f"torch ops: view (rows, groups, {npc}), abs().amax(-1), clamp, x * (Q / amax), "
                                f"{encode}")


def per_block_cast_baseline(op, options):
    bm, bk, fmt = options["block_m"], options["block_k"], options["fmt"]
    encode = ".to(float8_e4m3fn)" if fmt == "e4m3" else "E2M1 by comparisons, packed"
    return _block_cast_baseline(options, (bm, bk),
                                f"torch ops: view (M/{bm}, {bm}, K/{bk}, {bk}), abs().amax((1, 3)), clamp, "
                                f"x * (Q / amax), {encode}")


# --- per_channel_cast ---

def per_channel_cast_baseline(op, options):
    npt, npc = options["num_per_tokens"], options["num_per_channels"]
    quantized = options["in_dtype"] == "e4m3"
    round_sf, packed = options["round_sf"], options["use_packed_ue8m0"]

    def one(values):
        m, k = values.shape
        xf = values.view(m // npt, npt, k)
        stored, _, mult = _scales(xf.abs().amax(dim=1), "e4m3", round_sf, False)
        return (xf * mult.unsqueeze(1)).view(m, k).to(torch.float8_e4m3fn), stored

    def run(inputs, flavor, rows):
        if quantized:
            data, sf = inputs[flavor]
            m, k = data.shape
            grid = _decode_sf(sf, m, k // npc, npc, get_flavor(flavor))

            def chunk(a, b):
                values = data[a:b].float().view(b - a, k // npc, npc) * grid[a:b].unsqueeze(-1)
                return one(values.view(b - a, k))
        else:
            x = inputs["x"]
            m = x.shape[0]

            def chunk(a, b):
                return one(x[a:b].float())
        if m % npt:
            raise ValueError(f"the baseline needs a number of rows that is a multiple of {npt}")
        if rows is not None and rows % npt:
            rows = None
        data_out, stored = in_row_chunks(chunk, m, rows)
        return data_out, _layout(stored, packed, False, flavor, pack_dim=0)
    source = "data.float() * sf over (1, npc) groups, " if quantized else "x.float(), "
    return Baseline(run, f"torch ops: {source}view (T/{npt}, {npt}, H), abs().amax(1), clamp, x * (Q / amax), "
                         ".to(float8_e4m3fn)")


# --- per_token_cast_and_cast_back ---

def round_trip_baseline(op, options):
    fmt, npc = options["fmt"], options["num_per_channels"]
    round_sf, use_e4m3_sf = options["round_sf"], options["use_e4m3_sf"]
    values = e2m1_values()

    def one(x):
        m, k = x.shape
        xf = x.float().view(m, k // npc, npc)
        _, sf, mult = _scales(xf.abs().amax(-1), fmt, round_sf, use_e4m3_sf)
        y = xf * mult.unsqueeze(-1)
        q = y.to(torch.float8_e4m3fn).float() if fmt == "e4m3" else values[e2m1_codes(y).int()]
        return (q * sf.unsqueeze(-1)).to(x.dtype).view(m, k)

    def run(inputs, flavor, rows):
        x = inputs["x"]
        return (in_row_chunks(lambda a, b: one(x[a:b]), x.shape[0], rows),)
    how = ".to(float8_e4m3fn).float()" if fmt == "e4m3" else "E2M1 by comparisons and a value table"
    return Baseline(run, f"torch ops: groups of {npc}, abs().amax(-1), x * (Q / amax), {how}, * sf, "
                         f".to(x.dtype)")


# --- cast ---

_CAST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}


def cast_baseline(op, options):
    if options["stochastic_rounding"]:
        # Its random counters are the flat indices of the whole tensor: no chunks.
        return chunked_reference(lambda inputs, flavor: op.reference(inputs, options, flavor), None, None,
                                 "stochastic_rounding not modelled; its counters index the whole tensor")
    dtype = _CAST_DTYPES[options["dtype"]]

    def run(inputs, flavor, rows):
        x = inputs["x"]
        return (in_row_chunks(lambda a, b: x[a:b].to(dtype, copy=True), x.shape[0], rows),)
    return Baseline(run, f"torch ops: x.to({str(dtype).removeprefix('torch.')})")


# --- cast_back ---

def _decode_sf(sf: torch.Tensor, nbm: int, nbk: int, bk: int, flavor) -> torch.Tensor:
    """An input SF of any stored form -> the fp32 (nbm, nbk) grid."""
    if sf.dtype == torch.float32:
        return sf
    if sf.dtype == torch.float8_e4m3fn:
        return sf.float()
    dim = 0 if bk == 1 else 1
    grid = sf.T if dim == 0 else sf
    exps = grid.contiguous().view(torch.uint8)[:, :nbm if dim == 0 else nbk]
    exps = exps.T if dim == 0 else exps
    return (exps.int() << 23).view(torch.float32)


def cast_back_baseline(op, options):
    bm, bk, out = options["block_m"], options["block_k"], options["fmt"]
    x_fmt = options["x_fmt"]
    dtype = torch.bfloat16 if out == "bf16" else torch.float32

    def one(data, sf):
        values = data.float() if x_fmt == "e4m3" else e2m1_unpack_values(data)
        m, k = values.shape
        if m % bm == 0 and k % bk == 0:
            y = values.view(m // bm, bm, k // bk, bk).mul_(sf.view(m // bm, 1, k // bk, 1))
        else:
            y = values * sf.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]
        return y.to(dtype).view(m, k)

    def run(inputs, flavor, rows):
        data, sf = inputs[flavor]
        m = data.shape[0]
        k = data.shape[1] * (2 if x_fmt == "e2m1" else 1)
        grid = _decode_sf(sf, -(-m // bm), -(-k // bk), bk, get_flavor(flavor))
        if rows is not None and rows % bm:
            rows = None
        return (in_row_chunks(lambda a, b: one(data[a:b], grid[a // bm:-(-b // bm)]), m, rows),)
    return Baseline(run, f"torch ops: data{'.float()' if x_fmt == 'e4m3' else ' via a byte->values table'} "
                         f"* sf broadcast over ({bm}, {bk}) blocks, .to({out})")


# --- per_block_cast_lossless ---

def lossless_baseline(op, options):
    xbm, xbk = options["x_block_m"], options["x_block_k"]
    obm, obk = options["out_block_m"], options["out_block_k"]
    packed, col = options["use_packed_ue8m0"], options["use_tma_aligned_col_major_sf"]
    headroom = 6  # FP4's 6 times 2^6 = 384 stays in E4M3

    def one(data, sf):
        values = e2m1_unpack_values(data)
        m, k = values.shape
        exps = sf.view(torch.int32) >> 23
        nbm, nbk = m // obm, k // obk
        grid = exps.view(nbm, obm // xbm, nbk, obk // xbk)
        e_out = (grid.amax(dim=(1, 3)) - headroom).clamp_min(0)
        # Each input block's exact power-of-two rescale 2^(e - e_out).
        scale = ((grid - e_out.view(nbm, 1, nbk, 1) + 127) << 23).view(torch.float32)
        y = values.view(m // xbm, xbm, k // xbk, xbk) * scale.view(m // xbm, 1, k // xbk, 1)
        return y.to(torch.float8_e4m3fn).view(m, k), (e_out << 23).view(torch.float32)

    def run(inputs, flavor, rows):
        data, sf = inputs["x_data"], inputs["x_sf"]
        if data.shape[0] % obm or (2 * data.shape[1]) % obk:
            raise ValueError(f"the baseline needs rows and columns that are multiples of the block {(obm, obk)}")
        out, sf_out = in_row_chunks(lambda a, b: one(data[a:b], sf[a // xbm:b // xbm]), data.shape[0], rows)
        return out, _layout(sf_out, packed, col, flavor, pack_dim=0 if obk == 1 else 1)
    return Baseline(run, "torch ops: FP4 via a byte->values table, block exponents from the SF bits, "
                         "x * 2^(e - e_out), .to(float8_e4m3fn)")


# --- batched_transpose_weight_sf ---

def _ue8m0_words(exps: torch.Tensor, pack: int) -> torch.Tensor:
    """uint8 exponents ``(..., C)`` -> words of ``pack`` bytes along the last dim (pad bytes 0)."""
    pad = -exps.shape[-1] % pack
    if pad:
        exps = torch.nn.functional.pad(exps, (0, pad))
    return exps.contiguous().view(torch.int16 if pack == 2 else torch.int32)


def transpose_weight_sf_baseline(op, options):
    bs = options["block_size"]

    def run(inputs, flavor, rows):
        pack = get_flavor(flavor).ue8m0_pack
        scales = [sf if sf.dim() == 3 else sf.unsqueeze(0) for sf in inputs["sf"]]
        # Per weight G * (n * P0 + k * P1) words.
        shapes = [sf.shape for sf in scales]
        size = sum(g * bs * (nsn * -(-nsk // pack) + nsk * -(-nsn // pack)) for g, nsn, nsk in shapes)
        pool = torch.empty(size, dtype=torch.int16 if pack == 2 else torch.int32)
        offset = 0
        for sf in scales:
            groups, nsn, nsk = sf.shape
            exps = (sf.view(torch.int32) >> 23).to(torch.uint8)
            # sf0 stored (G, P0, n): each block row's words along K over its bs weight rows; then
            # sf1 stored (G, P1, k): each block column's words along N over its bs weight columns.
            for words, blocks in ((_ue8m0_words(exps, pack), nsn), (_ue8m0_words(exps.transpose(1, 2), pack), nsk)):
                part = groups * words.shape[2] * blocks * bs
                pool[offset:offset + part].view(groups, words.shape[2], blocks, bs).copy_(
                    words.transpose(1, 2).unsqueeze(-1).expand(groups, words.shape[2], blocks, bs))
                offset += part
        return (pool,)
    return Baseline(run, "torch ops: exponent bytes view(int32) >> 23, padded and viewed as the flavor's "
                         "int16/int32 words, expand over the block's rows into one pool", chunks=False)


# --- norm_backward ---

def norm_backward_baseline(op, options):
    out_scale = 0.3 if options["scaled"] else 1.0

    def run(inputs, flavor, rows):
        x, rstd = inputs["x"], inputs["rstd"][:, None]
        xh = x.float() * rstd
        d = inputs["out_grad"].float() * out_scale
        g = d * inputs["weight"].float()
        m = (xh * g).sum(-1, keepdim=True) / x.shape[1]
        x_grad = (g - xh * m) * rstd
        if "residual_out_grad" in inputs:
            x_grad = x_grad + inputs["residual_out_grad"].float()
        weight_grad = inputs["weight_grad"]
        return x_grad.to(x.dtype), ((xh * d).sum(0) + weight_grad.float()).to(weight_grad.dtype)
    return Baseline(run, "torch ops in fp32: xh = x * rstd, (xh * g).sum(-1) / H, (g - xh * m) * rstd, "
                         "(xh * d).sum(0) + weight_grad", same_bits=False, chunks=False)


# --- swiglu_backward(_and_per_token_cast) ---

def _swiglu_backward_terms(x, g, w, valid, rsf, clamp, do_recompute):
    """fp32 ``(x_grad, weight_grad, act_out)`` of rows ``x`` (``(n, 2H)`` fp32), ``g`` (``(n, H)``)."""
    a, b = x.chunk(2, dim=1)
    gate_grad = up_grad = None
    if clamp is not None:
        gate_grad, up_grad = a <= clamp, b.abs() <= clamp
        a, b = a.clamp(max=clamp), b.clamp(-clamp, clamp)
    s = torch.sigmoid(a)
    silu = a * s
    weight = valid.float() if w is None else torch.where(valid, w * rsf, 0.0)
    gw = g * weight.unsqueeze(1)
    d_a = gw * s * b * (1 + a * (1 - s))
    d_b = gw * silu
    if clamp is not None:
        d_a, d_b = d_a * gate_grad, d_b * up_grad
    act = silu * b
    weight_grad = torch.where(valid, (g * act).sum(dim=1) * rsf, 0.0) if w is not None else None
    act_out = act * weight.unsqueeze(1) if do_recompute else None
    return torch.cat([d_a, d_b], dim=1), weight_grad, act_out


def _swiglu_baseline(options, quantized: bool):
    weights, clamp = options["weights"], 10.0 if options["clamp"] else None
    rsf = 2.5 if weights else 1.0
    recompute = options["do_recompute"]

    def run(inputs, flavor, rows):
        x, g = inputs["x"], inputs["act_x_grad"]
        num_tokens, hidden = g.shape
        w = inputs.get("topk_weights")
        valid = expert_rows(inputs.get("psum_num_tokens_per_expert"), num_tokens, get_token_alignment())
        out_dtype = torch.bfloat16 if quantized else x.dtype
        if quantized:
            npc = options["num_per_channels"]
            scales = inputs["x_sf"].repeat_interleave(npc, dim=1)

        def chunk(a, b):
            values = x[a:b].float() * scales[a:b] if quantized else x[a:b].float()
            grad, weight_grad, act_out = _swiglu_backward_terms(
                values, g[a:b].float(), None if w is None else w[a:b], valid[a:b], rsf, clamp, recompute)
            outs = [grad.to(out_dtype)]
            if quantized:
                groups = grad.view(b - a, -1, npc)
                stored, _, mult = _scales(groups.abs().amax(-1), "e4m3", options["round_sf"], False)
                outs += [(groups * mult.unsqueeze(-1)).view(b - a, -1).to(torch.float8_e4m3fn),
                         torch.where(valid[a:b].unsqueeze(1), stored, 0.0)]
            outs.append(weight_grad if weight_grad is not None else grad.new_zeros(0))
            outs.append(act_out.to(out_dtype) if act_out is not None else grad.new_zeros((0, hidden), dtype=out_dtype))
            return tuple(outs)

        results = list(in_row_chunks(chunk, num_tokens, rows))
        if quantized:
            results[2] = _layout(results[2], options["use_packed_ue8m0"], options["use_tma_aligned_col_major_sf"],
                                 flavor)
        return tuple(results)
    cast = ", amax per group of the fp32 gradient, x * (Q / amax), .to(float8_e4m3fn)" if quantized else ""
    return Baseline(run, f"torch ops in fp32: sigmoid, silu, products for dA, dB, act; (g * act).sum(-1)"
                         f"{cast}", same_bits=False)


def swiglu_backward_baseline(op, options):
    return _swiglu_baseline(options, False)


def swiglu_backward_and_per_token_cast_baseline(op, options):
    return _swiglu_baseline(options, True)


# --- norm_forward / norm_forward_and_per_token_cast ---

def _rms_norm(x, weight, residual, eps):
    """``(out in x's dtype, rstd, residual_out or an empty tensor)``: RMSNorm in torch ops."""
    r = x if residual is None else x + residual
    rf = r.float()
    rstd = torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps)
    y = rf * rstd
    if weight is not None:
        y = y * weight.float()
    return y, rstd.squeeze(-1), r if residual is not None else x.new_empty(0)


def _norm_rows(inputs, start, stop):
    residual = inputs.get("residual")
    return inputs["x"][start:stop], inputs.get("weight"), None if residual is None else residual[start:stop]


def norm_forward_baseline(op, options):
    def run(inputs, flavor, rows):
        def chunk(start, stop):
            x, weight, residual = _norm_rows(inputs, start, stop)
            y, rstd, summed = _rms_norm(x, weight, residual, NORM_EPS)
            return y.to(x.dtype), rstd, summed
        return in_row_chunks(chunk, inputs["x"].shape[0], rows)
    return Baseline(run, "torch ops: (x + residual), .float().pow(2).mean(-1), rsqrt(+ eps), * rstd * weight, "
                         ".to(x.dtype)", same_bits=False)


def norm_forward_cast_baseline(op, options):
    round_sf, packed = options["round_sf"], options["use_packed_ue8m0"]
    col, with_bf16 = options["use_tma_aligned_col_major_sf"], options["with_out_bf16"]

    def run(inputs, flavor, rows):
        def chunk(start, stop):
            x, weight, residual = _norm_rows(inputs, start, stop)
            y, rstd, summed = _rms_norm(x, weight, residual, NORM_EPS)
            u = y.to(x.dtype)
            data, stored, _ = _block_quant(u, "e4m3", 1, 32, round_sf, False)
            out_bf16 = u.to(torch.bfloat16) if with_bf16 else x.new_empty(0, dtype=torch.bfloat16)
            return data, stored, out_bf16, rstd, summed
        data, stored, out_bf16, rstd, summed = in_row_chunks(chunk, inputs["x"].shape[0], rows)
        return data, _layout(stored, packed, col, flavor), out_bf16, rstd, summed
    return Baseline(run, "torch ops: RMSNorm as norm_forward's baseline, then view (rows, H/32, 32), "
                         "abs().amax(-1), clamp, u * (Q / amax), .to(float8_e4m3fn)", same_bits=False)


# --- swiglu_forward / swiglu_forward_and_per_token_cast ---

def _swiglu(x: torch.Tensor, topk_weights, routed_scaling_factor, clamp_value) -> torch.Tensor:
    hidden = x.shape[1] // 2
    gate, up = x[:, :hidden].float(), x[:, hidden:].float()
    if clamp_value is not None:
        gate = gate.clamp(max=clamp_value)
        up = up.clamp(-clamp_value, clamp_value)
    y = torch.nn.functional.silu(gate) * up
    if topk_weights is not None:
        weights = topk_weights * routed_scaling_factor if routed_scaling_factor is not None else topk_weights
        y = y * weights[:, None]
    return y


def _swiglu_chunk(inputs, options, a, b):
    weights = inputs.get("topk_weights")
    return _swiglu(inputs["x"][a:b], None if weights is None else weights[a:b],
                   2.5 if options["weights"] else None, 10.0 if options["clamp"] else None)


def swiglu_forward_baseline(op, options):
    dtype = torch.bfloat16 if options["fmt"] == "bf16" else torch.float32

    def run(inputs, flavor, rows):
        return (in_row_chunks(lambda a, b: _swiglu_chunk(inputs, options, a, b).to(dtype), inputs["x"].shape[0], rows),)
    # torch's silu (float32 exp, x * sigmoid(x)) is not the op's correctly rounded quotient.
    return Baseline(run, "torch ops: F.silu(gate.float()) * up.float() (clamp, * weights), .to(fmt); every row",
                    same_bits=False)


def swiglu_cast_baseline(op, options):
    npc, round_sf = options["num_per_channels"], options["round_sf"]
    packed, col = options["use_packed_ue8m0"], options["use_tma_aligned_col_major_sf"]

    def run(inputs, flavor, rows):
        def chunk(a, b):
            return _block_quant(_swiglu_chunk(inputs, options, a, b), "e4m3", 1, npc, round_sf, False)[:2]
        data, stored = in_row_chunks(chunk, inputs["x"].shape[0], rows)
        return data, _layout(stored, packed, col, flavor)
    return Baseline(run, f"torch ops: F.silu(gate.float()) * up.float() (clamp, * weights), view (rows, groups, "
                         f"{npc}), abs().amax(-1), clamp, y * (Q / amax), .to(float8_e4m3fn); every row",
                    same_bits=False)


def swiglu_channel_baseline(op, options):
    npt, round_sf, transpose = options["num_per_tokens"], options["round_sf"], not options["without_transpose"]

    def run(inputs, flavor, rows):
        x = inputs["x"]
        m = x.shape[0]
        if m % npt:
            raise ValueError(f"the baseline needs a number of rows that is a multiple of {npt}")
        act = _swiglu(x, None, None, 10.0 if options["clamp"] else None).bfloat16().float()
        hidden = act.shape[1]
        values = act.view(m // npt, npt, hidden)
        stored, _, mult = _scales(values.abs().amax(dim=1), "e4m3", round_sf, False)
        data = (values * mult.unsqueeze(1)).view(m, hidden).to(torch.float8_e4m3fn)
        return (data.T.contiguous() if transpose else data), stored
    return Baseline(run, f"torch ops: F.silu(gate.float()) * up.float() (clamp), .bfloat16(), view (T/{npt}, {npt}, "
                         "H), abs().amax(1), clamp, act * (Q / amax), .to(float8_e4m3fn), .T.contiguous()",
                    same_bits=False, chunks=False)


BASELINES = {
    "per_token_cast": per_token_cast_baseline,
    "per_token_cast_and_cast_back": round_trip_baseline,
    "per_block_cast": per_block_cast_baseline,
    "per_channel_cast": per_channel_cast_baseline,
    "norm_backward": norm_backward_baseline,
    "per_block_cast_lossless": lossless_baseline,
    "cast": cast_baseline,
    "cast_back": cast_back_baseline,
    "batched_transpose_weight_sf": transpose_weight_sf_baseline,
    "swiglu_backward": swiglu_backward_baseline,
    "swiglu_backward_and_per_token_cast": swiglu_backward_and_per_token_cast_baseline,
    "norm_forward": norm_forward_baseline,
    "norm_forward_and_per_token_cast": norm_forward_cast_baseline,
    "swiglu_forward": swiglu_forward_baseline,
    "swiglu_forward_and_per_token_cast": swiglu_cast_baseline,
    "swiglu_forward_and_per_channel_cast_and_transpose": swiglu_channel_baseline,
}
