"""``reduce_fused`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

The expanded rows ``x [N, H]`` (fp32, bf16 or E4M3 as integer bit views) are summed back per
token: ``out[t] = cast(sf · Σ_k fma-chain(x[pos[t, k]], s[t, k]))`` (``docs/moe/reduce_fused.md``).
Work items ``(token tile of BLOCK_M tokens, column chunk of BLOCK_H columns)`` go round-robin to
persistent workers, the chunks of one token tile on consecutive iterations of one worker. Per item:

1. DMA the tile's slot positions and weights on chip;
2. one lane per token: each slot's position checked against ``[-1, N)`` (a position outside
   raises the status word and counts as unused), and its scale ``s = fl(w · x_sf[pos])``, the
   row scale gathered from global memory at the position;
3. one lane per (token, column): ``acc = +0.0``, then ``acc = fma(x[pos, col], s, acc)`` for the
   used slots in slot order, ``acc · sf``, the output cast; columns past ``H`` read nothing;
4. DMA the output tile out.

Absent options cost no specialisation: the dispatch passes weights of 1 (``fl(1 · v) = v``), a
one-element ``x_sf`` of 1 (every position reads its element 0) and ``sf = 1`` (``acc · 1 = acc``),
so one kernel per ``(K, input format, output format)`` serves every combination, and ``N`` and
``H`` are runtime values.

On Ascend phases 2 and 3 run in SIMT regions: both read global memory at computed addresses
(the row scales and the rows of ``x`` at data-dependent positions, which no SIMD load or DMA of a
fixed tile can express), and a SIMT lane per column reads consecutive addresses across the
threads. Phase 3 needs the result of phase 2 from other lanes: the two are separate regions (the
region boundary orders them). On cpu the row ranges of tokens go to threads
(``vmi_core.cpu_parallel``).
"""


from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell
from vmi_core.tl.simd import fma

from .common import STATUS_BAD_INDEX, STATUS_WORDS, clamp, padded, row_chunks

FORMATS = ("fp32", "bf16", "e4m3")
KERNEL_DTYPE = {"fp32": "float32", "bf16": "uint16", "e4m3": "uint8"}
# Tokens per work tile and columns per chunk: an fp32 output tile is 32 KiB, two versions of it
# leave most of the 216 KiB a SIMT kernel gets of the Ascend UB; a decode-size call (a few tokens)
# still makes H / 512 work items (14 for H = 7168).
BLOCK_M = 16
BLOCK_H = 512


@dataclass(frozen=True)
class ReduceFusedSpec:
    """Everything a reduce_fused kernel is specialised on (N, H and the token count are runtime values)."""

    num_topk: int
    in_fmt: str
    out_fmt: str

    def __post_init__(self) -> None:
        if self.in_fmt not in FORMATS or self.out_fmt not in FORMATS:
            raise ValueError(f"formats must be in {FORMATS}, got {(self.in_fmt, self.out_fmt)}")
        if self.num_topk < 1:
            raise ValueError(f"num_topk must be positive, got {self.num_topk}")


def decode(fmt: str, value):
    """An element of ``x`` (its bit view) as fp32, exactly."""
    if fmt == "bf16":
        return F.bf16_to_f32(value)
    if fmt == "e4m3":
        return F.e4m3_to_f32(value)
    return value


def encode(fmt: str, value):
    """fp32 to the output format: bf16 round to nearest even; E4M3 round to nearest even,
    saturating to +-448 (+-inf too), NaN to 0x7F with its sign (torch's ``.to(float8_e4m3fn)``)."""
    if fmt == "bf16":
        return F.f32_to_bf16(value)
    if fmt == "e4m3":
        return F.f32_to_e4m3(value)
    return value


def _config(spec: ReduceFusedSpec) -> dict:
    # Ascend SIMT regions touch 8-bit data element by element only (vmi_core.compile.pass_configs).
    return {"simd_parallel": False, **({"simt_8bit": True} if "e4m3" in (spec.in_fmt, spec.out_fmt) else {})}


@kernel(config=_config)
def build_reduce_fused(spec: ReduceFusedSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K, BM, HB = spec.num_topk, BLOCK_M, BLOCK_H
    KP = padded(K)
    in_dtype, out_dtype = KERNEL_DTYPE[spec.in_fmt], KERNEL_DTYPE[spec.out_fmt]
    M = TK.dynamic("M")
    NX = TK.dynamic("NX")
    NS = TK.dynamic("NS")
    H = TK.dynamic("H")

    @T.macro
    def slot_scales(P, W, XSF, STATUS, pos, w, used, scale, row0, num_rows):
        # One lane per token: the used positions (-1 for unused, bad and past-the-end slots) and
        # the scales. Rows past M hold stale data (zeros on cpu): they must not raise the flag.
        for i in T.Parallel(BM):
            p = T.alloc_var("int32")
            inside = T.alloc_var("int32")
            for k in T.serial(K):
                p = pos[i, k]
                inside = T.Cast("int32", row0 + i < M)
                if inside > 0 and (p < -1 or p >= num_rows):
                    STATUS[STATUS_BAD_INDEX] = 1
                used[i, k] = T.Select(inside > 0 and p >= 0 and p < num_rows, p, -1)
                # x_sf has N elements, or one (1.0) when the call has none: the clamp reads element 0.
                scale[i, k] = w[i, k] * XSF[clamp(p, 0, NS - 1)]

    @T.macro
    def accumulate(X, SF, used, scale, o, h0):
        for i, j in T.Parallel(BM, HB):
            acc = T.alloc_var("float32")
            p = T.alloc_var("int32")
            acc = f32_const(0.0)
            for k in T.serial(K):
                p = used[i, k]
                if p >= 0 and h0 + j < H:
                    acc = fma(decode(spec.in_fmt, X[p, h0 + j]), scale[i, k], acc)
            o[i, j] = encode(spec.out_fmt, acc * SF[0])

    @TK.prim_func
    def reduce_fused_kernel(
        X: TK.Tensor((NX, H), in_dtype),
        W: TK.Tensor((M, K), "float32"),
        P: TK.Tensor((M, K), "int32"),
        XSF: TK.Tensor((NS,), "float32"),
        SF: TK.Tensor((1,), "float32"),
        OUT: TK.Tensor((M, H), out_dtype),
        STATUS: TK.Tensor((STATUS_WORDS,), "int32"),
        num_rows: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tm, th in sh.tiles([T.ceildiv(M, BM), T.ceildiv(H, HB)], worker, group_size=T.ceildiv(H, HB)):
                row0 = T.alloc_var("int32")
                h0 = T.alloc_var("int32")
                row0 = tm * BM
                h0 = th * HB
                pos = sh.tile((BM, KP), "int32")
                w = sh.tile((BM, KP), "float32")
                used = sh.tile((BM, KP), "int32")
                scale = sh.tile((BM, KP), "float32")
                o = sh.tile((BM, HB), out_dtype)
                sh.buffer_versions({pos: 2, w: 2, o: 2})
                sh.copy(P[row0, 0], pos)
                sh.copy(W[row0, 0], w)
                with sh.vector(SIMT):
                    slot_scales(P, W, XSF, STATUS, pos, w, used, scale, row0, num_rows)
                with sh.vector(SIMT):
                    accumulate(X, SF, used, scale, o, h0)
                sh.copy(o, OUT[row0, h0])

    return reduce_fused_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.reduce_fused.ReduceFusedCall``) on ``target``."""
    spec = call.spec
    num_tokens, hidden = call.out.shape
    if hidden == 0:
        return
    x, out = bit_view(call.x), bit_view(call.out)
    if spec.in_fmt == "e4m3":
        x = x.view(torch.uint8)

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, hidden):
            kernel(x, call.weights[lo:hi], call.positions[lo:hi], call.x_sf, call.sf, out[lo:hi], call.status,
                   call.num_rows)

    build_reduce_fused.launch_rows(spec, target, num_tokens, run, align=BLOCK_M)
