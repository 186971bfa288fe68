"""``swiglu_forward`` and ``swiglu_forward_and_per_token_cast`` as one parallel-style TileLang
kernel for ascend, cuda and cpu.

A work tile is one token (row) and ``BLOCK_K`` output channels, handed out round-robin to
persistent workers, the hidden tiles of one token on consecutive iterations of one worker.
Token count, hidden size, strides, the expert layout and the clamp and scaling values are
runtime values, so one compiled kernel serves every shape of an option combination.
Per tile:

1. row validity: with an expert layout (``psum``), a binary search over the aligned expert ends
   gives the row's expert; a row outside every expert's range is skipped whole (nothing is read
   or written);
2. DMA the gate and up slices of the row into two on-chip tiles; read the row's weight;
3. per element: clamp, ``e = exp(-a)`` over the tile (``Shell.exp``), ``silu = a / (1 + e)``,
   ``y = silu * b * w`` (fp32), stored as fp32 or bf16, or kept for quantization;
4. E4M3: per group of ``num_per_channels``, the amax, scales and codes (vmi_quant.kernels.common);
5. clamp counters: per-row sums of the three clamp indicators (fixed-order fp32 sums of 0/1,
   exact), added to the worker's int64 totals, which go to a per-worker workspace row at the end;
6. DMA the output slice; scatter the tile's SF into its layout (unused packed bytes untouched).

On Ascend, phases 3-5 run as explicit vector code in SIMD regions, except the exps, which run
as SIMT lanes between them (``Shell.exp``); the SF scatter writes at computed addresses and runs in
a SIMT region.
"""

from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.targets import lowering_target
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import keep, select
from vmi_core.tl.vector import decode
from vmi_quant.sf_layout import SFLayout, sf_address

from .common import KERNEL_DTYPE, ScaleRule, canonical_nan, encode, scale_from_amax

NUM_PER_CHANNELS = (32, 128)
# Output channels per tile: whole E4M3 groups and packed SF words (both flavors), and few enough
# tiles per row that the per-tile expert search stays cheap.
BLOCK_K = 512
# Hidden sizes are multiples of this (one vector register of 32-bit lanes).
HIDDEN_ALIGN = 64
# Clamp counters: gate above the clamp, up above it, up below its negative, elements of valid rows.
NUM_COUNTERS = 4
_OUT_DTYPE = {"fp32": "float32", "bf16": "uint16", "e4m3": "uint8"}


@dataclass(frozen=True)
class SwigluForwardSpec:
    """Everything a swiglu_forward kernel is specialised on (shapes and values are runtime).

    ``flush_division``: the quotient ``a / (1 + exp(-a))`` with subnormal operands and results
    flushed to signed zero, as the Ascend vector division unit computes it (``ascend`` flavor);
    otherwise the IEEE quotient.
    """

    in_fmt: str
    fmt: str
    num_per_channels: int | None = None
    rule: ScaleRule | None = None
    sf_layout: SFLayout | None = None
    with_psum: bool = False
    with_weights: bool = False
    with_scaling_factor: bool = False
    with_clamp: bool = False
    count_clamped: bool = False
    flush_division: bool = False


def clamp_gate_up(a, b, clamp):
    """``(min(a, c), clamp(b, -c, c))`` of fp32 lane values; comparisons keep a NaN as it is (a NaN
    is above nothing and below nothing)."""
    return clamped_gate(a, clamp, True), select(b > clamp, clamp, select(b < -clamp, -clamp, b))


def clamped_gate(a, clamp, with_clamp: bool):
    """The gate ``a`` as ``silu`` sees it: ``min(a, c)`` with a clamp (``clamp_gate_up``'s)."""
    return select(a > clamp, clamp, a) if with_clamp else a


def silu_quotient(a, exp_neg_a, flush_division: bool, in_simd: bool):
    """``fl(a / fl(1 + exp(-a)))`` of an fp32 lane value (bound once: ``keep``), given ``exp(-a)``
    (correctly rounded: ``Shell.exp``); ``flush_division``: the Ascend vector division (subnormal
    operand and quotient flushed to signed zero, ``vmi_core.tl.formats.ascend_quotient``), which
    SIMD regions run (``in_simd``) and scalar code models."""
    return F.flavor_quotient(a, 1.0 + exp_neg_a, flush_division, in_simd)


@kernel(simd_parallel=False, simt_8bit=True)
def build_swiglu_forward(spec: SwigluForwardSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BK = BLOCK_K
    in_dtype = KERNEL_DTYPE[spec.in_fmt]
    out_dtype = _OUT_DTYPE[spec.fmt]
    quantized = spec.fmt == "e4m3"
    npc = spec.num_per_channels or BK
    groups = BK // npc
    sf_dtype = "uint8" if quantized and spec.sf_layout.kind == "ue8m0" else "float32"

    N = TK.dynamic("N")
    XW = TK.dynamic("XW")
    OW = TK.dynamic("OW")
    E = TK.dynamic("E")
    WN = TK.dynamic("WN")
    SF_LEN = TK.dynamic("SF_LEN")
    NW = TK.dynamic("NW")
    x_stride = TK.dynamic("x_stride")
    H = XW // 2
    num_sf_cols = T.ceildiv(H, npc)

    def negated_gate(at, xl, clamp):
        return -clamped_gate(decode(spec.in_fmt, at, xl), clamp, spec.with_clamp)

    def swiglu(at, xl, xr, clamp, weight, exp_neg_gate):
        a, b = decode(spec.in_fmt, at, xl), decode(spec.in_fmt, at, xr)
        if spec.with_clamp:
            a, b = clamp_gate_up(a, b, clamp)
        y = silu_quotient(keep(a), at.load(exp_neg_gate), spec.flush_division, sh.in_simd) * b
        if spec.with_weights:
            y = y * weight
        return canonical_nan(y)

    def output_value(at, xl, xr, clamp, weight, exp_neg_gate):
        y = swiglu(at, xl, xr, clamp, weight, exp_neg_gate)
        return F.f32_to_bf16(y) if spec.fmt == "bf16" else y

    def indicator(at, cols, hit):
        return select(at.column() < cols, select(hit, F.f32_const(1.0), F.f32_const(0.0)), F.f32_const(0.0))

    @T.macro
    def count_clamped(xl, xr, clamp, cols, gate_count, up_above_count, up_below_count):
        # On the values before clamping.
        sh.row_sum(gate_count, (1, BK), lambda at: indicator(at, cols, decode(spec.in_fmt, at, xl) > clamp))
        sh.row_sum(up_above_count, (1, BK), lambda at: indicator(at, cols, decode(spec.in_fmt, at, xr) > clamp))
        sh.row_sum(up_below_count, (1, BK), lambda at: indicator(at, cols, decode(spec.in_fmt, at, xr) < -clamp))

    @T.macro
    def quantize(y, amax, sf_val, sf_inv, q):
        # Groups lie wholly inside the hidden size (H % npc == 0): no column mask needed.
        sh.segment_reduce(amax, (1, BK), npc, lambda at: F.abs_bits(at.load(y)), "max", F.u32(0))
        sh.elementwise(sh.group_domain(1, groups), lambda at: scale_from_amax(spec.rule, at.load(amax)),
                       (sf_val, sf_inv))
        sh.elementwise((1, BK), lambda at: encode("e4m3", at.load(y) * at.group(sf_inv, npc)), q)

    @T.macro
    def gate_exps(xl, clamp, neg_gate, exp_neg_gate):
        with sh.vector(SIMD):
            sh.elementwise((1, BK), lambda at: negated_gate(at, xl, clamp), neg_gate)
        sh.exp((1, BK), neg_gate, exp_neg_gate)

    @T.macro
    def activation(xl, xr, clamp, weight, exp_neg_gate, y, amax, sf_val, sf_inv, out):
        if quantized:
            sh.elementwise((1, BK), lambda at: swiglu(at, xl, xr, clamp, weight, exp_neg_gate), y)
            quantize(y, amax, sf_val, sf_inv, out)
        else:
            sh.elementwise((1, BK), lambda at: output_value(at, xl, xr, clamp, weight, exp_neg_gate), out)

    @T.macro
    def scatter_scales(SF, sf_val, row, k0, sf_sm, sf_sk):
        for g in T.Parallel(groups):
            if k0 // npc + g < num_sf_cols:
                SF[sf_address(row, k0 // npc + g, sf_sm, sf_sk, spec.sf_layout)] = sf_val[0, g]

    @TK.prim_func
    def swiglu_forward_kernel(
        X: TK.StridedTensor((N, XW), (x_stride, 1), in_dtype),
        PSUM: TK.Tensor((E,), "int32"),
        WEIGHTS: TK.Tensor((WN,), "float32"),
        OUT: TK.Tensor((N, OW), out_dtype),
        SF: TK.Tensor((SF_LEN,), sf_dtype),
        COUNTS: TK.Tensor((NW, NUM_COUNTERS), "int64"),
        x_stride: TK.int32, row_base: TK.int32, alignment: TK.int32, clamp: TK.float32,
        scaling_factor: TK.float32, sf_sm: TK.int32, sf_sk: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            # The worker's clamp counters: exact integers, written once after its last tile.
            gate_above = T.alloc_var("int64")
            up_above = T.alloc_var("int64")
            up_below = T.alloc_var("int64")
            elements = T.alloc_var("int64")
            gate_above = 0
            up_above = 0
            up_below = 0
            elements = 0
            for t, tk in sh.tiles([N, T.ceildiv(H, BK)], worker, group_size=T.ceildiv(H, BK)):
                # Scalars, not let bindings: TileLang would inline the index math into every access.
                row = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                cols = T.alloc_var("int32")
                valid = T.alloc_var("int32")
                row = t
                k0 = tk * BK
                cols = T.min(H - k0, BK)
                valid = 1
                if spec.with_psum:
                    # The row's expert: the first whose aligned end lies past the row (row + row_base
                    # is the row's index in the whole call). Valid iff before that expert's end.
                    lo = T.alloc_var("int32")
                    hi = T.alloc_var("int32")
                    lo = 0
                    hi = E
                    while lo < hi:
                        mid = T.alloc_var("int32")
                        mid = (lo + hi) // 2
                        if (PSUM[mid] + alignment - 1) // alignment * alignment > row + row_base:
                            hi = mid
                        else:
                            lo = mid + 1
                    valid = 0
                    if lo < E:
                        if row + row_base < PSUM[lo]:
                            valid = 1
                xl = sh.tile((1, BK), in_dtype)
                xr = sh.tile((1, BK), in_dtype)
                out = sh.tile((1, BK), out_dtype)
                y = sh.tile((1, BK), "float32")
                neg_gate = sh.tile((1, BK), "float32")
                exp_neg_gate = sh.tile((1, BK), "float32")
                amax = sh.group_tile(1, groups, "uint32")
                sf_val = sh.group_tile(1, groups, sf_dtype)
                sf_inv = sh.group_tile(1, groups, "float32")
                gate_count = sh.tile((1,), "float32")
                up_above_count = sh.tile((1,), "float32")
                up_below_count = sh.tile((1,), "float32")
                sh.buffer_versions({xl: 2, xr: 2, out: 2})
                if valid != 0:
                    weight = T.alloc_var("float32")
                    weight = 1.0
                    if spec.with_weights:
                        weight = WEIGHTS[row + row_base]
                        if spec.with_scaling_factor:
                            weight = weight * scaling_factor
                    sh.copy(X[row, k0], xl)
                    sh.copy(X[row, H + k0], xr)
                    gate_exps(xl, clamp, neg_gate, exp_neg_gate)
                    with sh.vector(SIMD):
                        activation(xl, xr, clamp, weight, exp_neg_gate, y, amax, sf_val, sf_inv, out)
                        if spec.count_clamped:
                            count_clamped(xl, xr, clamp, cols, gate_count, up_above_count, up_below_count)
                    sh.copy(out, OUT[row, k0])
                    if quantized:
                        with sh.vector(SIMT):
                            scatter_scales(SF, sf_val, row, k0, sf_sm, sf_sk)
                    if spec.count_clamped:
                        gate_above = gate_above + T.Cast("int64", gate_count[0])
                        up_above = up_above + T.Cast("int64", up_above_count[0])
                        up_below = up_below + T.Cast("int64", up_below_count[0])
                        elements = elements + T.Cast("int64", cols)
            if spec.count_clamped:
                # One lane stores the totals (global memory is written from vector code on Ascend).
                with sh.vector(SIMT):
                    for lane in T.Parallel(1):
                        COUNTS[worker, lane] = gate_above
                        COUNTS[worker, lane + 1] = up_above
                        COUNTS[worker, lane + 2] = up_below
                        COUNTS[worker, lane + 3] = elements

    return swiglu_forward_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.swiglu_forward.SwigluForwardCall``) on ``target``: the
    outputs of valid rows are written, and the clamp counts are added to ``call.clamped_count``."""
    spec = call.spec
    num_rows = call.x.shape[0]
    if num_rows == 0:
        return
    x = bit_view(call.x)
    out = bit_view(call.out)
    device = x.device
    dummy_int = torch.zeros(1, dtype=torch.int32, device=device)
    dummy_float = torch.zeros(1, dtype=torch.float32, device=device)
    psum = call.psum if call.psum is not None else dummy_int
    weights = call.topk_weights if call.topk_weights is not None else dummy_float
    clamp = 0.0 if call.clamp_value is None else call.clamp_value
    scaling = 1.0 if call.routed_scaling_factor is None else call.routed_scaling_factor
    workers = Shell(lowering_target(target)).workers
    partial_counts = []

    def run(kernel, start: int, stop: int) -> None:
        if spec.fmt == "e4m3":
            sf, sf_sm, sf_sk = spec.sf_layout.kernel_view(call.sf[start:stop])
        else:
            sf, sf_sm, sf_sk = dummy_float, 0, 0
        counts = torch.zeros((workers, NUM_COUNTERS), dtype=torch.int64, device=device)
        kernel(x[start:stop], psum, weights, out[start:stop], sf, counts, x.stride(0), start, call.alignment,
               clamp, scaling, sf_sm, sf_sk)
        partial_counts.append(counts)

    # Threads split by rows (the kernel finds each row's expert from its index in the call).
    build_swiglu_forward.launch_rows(spec, target, num_rows, run)
    if spec.count_clamped:
        call.clamped_count += torch.stack(partial_counts).sum(dim=(0, 1))
