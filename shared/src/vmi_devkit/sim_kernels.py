"""Small kernels for the ascend-sim tests.

``row_scale`` divides every row of X by its largest |x|: it has what the op kernels have
(persistent work tiles over the cores, double-buffered DMA in and out with tails, one SIMT
region whose two phases TileLang separates with a barrier) in a source short enough to break
on purpose.

The SIMD kernels write their vector regions as explicit ``T.simd`` code: ``token_cast`` is a
per-token amax / scale / e4m3 cast, and one kernel per instruction family (``float``, ``int``,
``convert``, ``rearrange``, ``memory``, ``gather``) runs a table of single instructions over
test registers. ``counted`` is a kernel small enough to count what it executes by hand. ``cube_gemm`` is one
``T.gemm`` on the Cube unit. ``simt_arith`` runs the SIMT unit's fp32 and int32 arithmetic over test
lanes, and ``dma_rounding`` shows the UB bytes a DMA burst rounds up to its 32-byte boundary.
These kernels are also the calibration kernels of ``vmi_devkit.calibration``.
"""

import functools
from types import SimpleNamespace

import tilelang.ascend.language as TA
import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, lower_artifact
from vmi_core.tl.shell import SIMD, SIMT, SIMT_THREADS, Shell
from vmi_core.tl.simd import absolute, bitcast, fma, maximum, sqrt

COLUMNS = 64


def build_row_scale(block_m: int, target: str):
    sh = Shell(target)
    TK = sh.T
    M = TK.dynamic("M")

    @TK.prim_func
    def row_scale(X: TK.Tensor((M, COLUMNS), "float32"), Y: TK.Tensor((M, COLUMNS), "float32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, block_m)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * block_m
                x = sh.tile((block_m, COLUMNS), "float32")
                amax = sh.tile((block_m, 1), "float32")
                y = sh.tile((block_m, COLUMNS), "float32")
                sh.buffer_versions({x: 2, y: 2})
                sh.copy(X[row0, 0], x)
                with sh.vector(SIMT):
                    sh.segment_reduce(amax, (block_m, COLUMNS), COLUMNS,
                                      lambda at, x=x: maximum(at.load(x), -at.load(x)), "max", T.float32(0))
                    for i, j in T.Parallel(block_m, COLUMNS):
                        y[i, j] = x[i, j] / amax[i, 0]
                sh.copy(y, Y[row0, 0])

    return row_scale


def row_scale(x, block_m: int, target: str):
    y = x.new_empty(x.shape)
    cached_kernel(build_row_scale, block_m, target)(x, y)
    return y


def row_scale_reference(x):
    return x / x.abs().amax(dim=1, keepdim=True)


@functools.cache
def row_scale_artifact(block_m: int):
    """TileLang's ascend lowering of the kernel: its source and device module (lowered once per
    process: the negative controls each break a copy of its source)."""
    return lower_artifact(build_row_scale(block_m, "ascend"), "ascend")


# ---- SIMT arithmetic and DMA rounding bytes ------------------------------------------------------------

SIMT_LANES = 2048
SIMT_FLOAT_INPUTS = 3  # a, b, c
SIMT_OPS = ("div", "sqrt", "mul", "add", "fma", "mul_add", "abs", "int_add", "int_mul")


def build_simt_arith(spec, target: str):
    """``Y[k, j]`` = op k of ``SIMT_OPS`` on lane j in a SIMT region, as bits: ``a / b``, ``sqrtf(a)``,
    ``a * b``, ``a + b``, ``fmaf(a, b, c)``, ``a * b + c`` written unfused (whether the compiler
    contracts it shows), ``fabsf(a)`` of the fp32 rows ``X = (a, b, c)``, and the int32 sum and product
    of the rows of ``I``."""
    assert spec is None
    sh = Shell(target)
    n = SIMT_LANES

    @T.prim_func
    def simt_arith(X: T.Tensor((SIMT_FLOAT_INPUTS, n), "float32"), I: T.Tensor((2, n), "int32"),
                   Y: T.Tensor((len(SIMT_OPS), n), "int32")):
        with sh.kernel(1):
            x = sh.tile((SIMT_FLOAT_INPUTS, n), "float32")
            i = sh.tile((2, n), "int32")
            y = sh.tile((len(SIMT_OPS), n), "int32")
            sh.copy(X, x)
            sh.copy(I, i)
            with sh.vector(SIMT):
                for j in T.Parallel(n):
                    a, b, c = x[0, j], x[1, j], x[2, j]
                    for k, value in enumerate((a / b, sqrt(a), a * b, a + b, fma(a, b, c), a * b + c, absolute(a))):
                        y[k, j] = bitcast(value, "int32")
                    y[7, j] = i[0, j] + i[1, j]
                    y[8, j] = i[0, j] * i[1, j]
            sh.copy(y, Y)

    return simt_arith


def run_simt_arith(x, i, target: str = "ascend-sim"):
    """``(len(SIMT_OPS), SIMT_LANES)`` int32 results of ``simt_arith`` for fp32 ``x`` and int32 ``i``."""
    y = torch.empty((len(SIMT_OPS), SIMT_LANES), dtype=torch.int32, device=x.device)
    cached_kernel(build_simt_arith, None, target)(x, i, y)
    return y


DMA_ROWS, DMA_BURST, DMA_ROW = 3, 13, 16  # fp32 elements: a 52-byte burst per row, rows 64 bytes apart in UB


def build_dma_rounding(spec, target: str):
    """Copies ``X (DMA_ROWS, DMA_BURST)`` into a UB tile of ``DMA_ROW`` columns, one burst per row, and
    the whole tile out to ``Y``: columns past the burst hold the bytes the DMA rounded each burst up with."""
    assert spec is None
    sh = Shell(target)

    @T.prim_func
    def dma_rounding(X: T.Tensor((DMA_ROWS, DMA_BURST), "float32"), Y: T.Tensor((DMA_ROWS, DMA_ROW), "float32")):
        with sh.kernel(1):
            x = sh.tile((DMA_ROWS, DMA_ROW), "float32")
            T.copy(X[0:DMA_ROWS, 0:DMA_BURST], x[0:DMA_ROWS, 0:DMA_BURST])
            T.copy(x, Y)

    return dma_rounding


def run_dma_rounding(x, target: str = "ascend-sim"):
    y = x.new_empty((DMA_ROWS, DMA_ROW))
    cached_kernel(build_dma_rounding, None, target)(x, y)
    return y


# ---- Cube kernel: one T.gemm on the Cube unit --------------------------------------------------------


def build_cube_gemm(shape, target: str):
    """``C = A · Bᵀ`` (fp32) of bf16 ``A (m, k)`` and ``B (n, k)`` on the Cube unit of one AI core: both
    operands to L1 (ND -> NZ), one L1 GEMM into L0C, L0C to global memory (NZ -> ND)."""
    m, n, k = shape
    sh = Shell(target, workers=1)
    TK = sh.T

    @TK.prim_func
    def cube_gemm(A: TK.Tensor((m, k), "bfloat16"), B: TK.Tensor((n, k), "bfloat16"), C: TK.Tensor((m, n), "float32")):
        with sh.persistent_kernel() as worker:
            for _ in sh.tiles([1], worker):
                a = TK.alloc_l1((m, k), "bfloat16")
                b = TK.alloc_l1((n, k), "bfloat16")
                acc = TK.alloc_l0c((m, n), "float32")
                T.copy(A[0, 0], a)
                T.copy(B[0, 0], b)
                T.gemm(a, b, acc, transpose_B=True, clear_accum=True)
                T.copy(acc, C[0, 0])

    return cube_gemm


def cube_gemm(a, b, target: str):
    c = torch.empty((a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
    cached_kernel(build_cube_gemm, (a.shape[0], b.shape[0], a.shape[1]), target)(a, b, c)
    return c


def cube_gemm_reference(a, b):
    """The Cube model's stated order: per output, the fp32 products (exact for bf16) added in
    increasing k to +0.0, one fp32 rounding per addition."""
    af, bf = a.float(), b.float()
    c = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float32)
    for q in range(a.shape[1]):
        c = c + af[:, q, None] * bf[None, :, q]
    return c


# ---- SIMD kernels: vector regions written as explicit T.simd code ---------------------------------

LANES = 64  # 32-bit lanes of a vector register
TOKEN_CAST_COLUMNS = 256  # a token-cast tile: 4 registers per row, 8 scale groups
GROUP = 32
E4M3_MAX = 448.0
SF_CLAMP = 1e-4
F32_ABS = 0x7FFFFFFF
F32_INF = 0x7F800000


def build_token_cast(spec, target: str):
    """Per-token cast of bf16 X to e4m3 codes Q, one fp32 scale per 32 channels (SF = amax / 448).

    ``spec`` is ``(block_m, patch_nan)``. Each row of a tile is four 64-lane registers; lanes past
    K are zeroed by comparing a lane index (``vci``) with the valid count, each 32-lane half is a
    scale group reduced with a masked ``vcmax`` on the |x| bit patterns (NaN above inf), the scale
    and its inverse come from TileLang's default (0-ulp) ``vdiv`` and are broadcast back to their
    half (``BRC_B32`` loads and a ``vsel``). The codes are the hardware ``vcvt`` (round to nearest
    even, saturating), stored one byte per 32-bit lane (``PK4_B32``). Saturating ``vcvt`` turns NaN
    into 0, so with ``patch_nan`` NaN lanes get 0x7F with the sign of the scaled value instead.
    """
    block_m, patch_nan = spec
    assert target == "ascend" and block_m % 8 == 0
    sh = Shell(target)
    TK = sh.T
    M, K, G = TK.dynamic("M"), TK.dynamic("K"), TK.dynamic("G")
    groups = TOKEN_CAST_COLUMNS // GROUP
    registers = TOKEN_CAST_COLUMNS // LANES

    @TK.prim_func
    def token_cast(X: TK.Tensor((M, K), "bfloat16"), Q: TK.Tensor((M, K), "uint8"), SF: TK.Tensor((M, G), "float32")):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([TK.ceildiv(M, block_m), TK.ceildiv(K, TOKEN_CAST_COLUMNS)], worker,
                                   group_size=TK.ceildiv(K, TOKEN_CAST_COLUMNS)):
                x = sh.tile((block_m, TOKEN_CAST_COLUMNS), "bfloat16")
                q = sh.tile((block_m, TOKEN_CAST_COLUMNS), "uint8")
                amax = sh.tile((block_m, groups), "int32")
                sf = sh.tile((block_m, groups), "float32")
                inv = sh.tile((block_m, groups), "float32")
                sh.buffer_versions({x: 2, q: 2})
                sh.copy(X[tm * block_m, tk * TOKEN_CAST_COLUMNS], x)
                with sh.vector(SIMD):
                    valid = K - tk * TOKEN_CAST_COLUMNS
                    lane = S.vci(0, "int32")
                    low = S.pset(32, "PAT_VL32")
                    every = S.pset(32, "PAT_ALL")  # bound first: a pset inside an expression does not lower
                    high = S.pnot(low, every)
                    zero = S.vdup(0, "int32")
                    for r in TK.serial(block_m):
                        for c in TK.serial(registers):
                            v = S.vcvt(S.vld(x[r, c * LANES], dist="UNPK_B16"), "float32")
                            a = S.vand(TK.reinterpret(v, "int32x64"), S.vdup(F32_ABS, "int32"))
                            a = S.vsel(a, zero, S.vcmps(lane, valid - c * LANES, op="lt"))
                            S.vsts(amax[r, 2 * c], S.vcmax(a, low), dist="ONEPT_B32")
                            S.vsts(amax[r, 2 * c + 1], S.vcmax(a, high), dist="ONEPT_B32")
                    S.mem_bar("VST_VLD")
                    for u in TK.serial(block_m * groups // LANES):
                        row = u * (LANES // groups)
                        clamped = S.vmaxs(TK.reinterpret(S.vld(amax[row, 0]), "float32x64"), TK.float32(SF_CLAMP))
                        S.vsts(sf[row, 0], S.vdiv(clamped, S.vdup(TK.float32(E4M3_MAX), "float32")))
                        S.vsts(inv[row, 0], S.vdiv(S.vdup(TK.float32(E4M3_MAX), "float32"), clamped))
                    S.mem_bar("VST_VLD")
                    for r in TK.serial(block_m):
                        for c in TK.serial(registers):
                            v = S.vcvt(S.vld(x[r, c * LANES], dist="UNPK_B16"), "float32")
                            scale = S.vsel(S.vld(inv[r, 2 * c], dist="BRC_B32"),
                                           S.vld(inv[r, 2 * c + 1], dist="BRC_B32"), low)
                            y = S.vmul(v, scale)
                            code = TK.reinterpret(S.vcvt(y, "float8_e4m3fn"), "int32x64")  # byte 4i: lane i's code
                            if patch_nan:
                                bits = TK.reinterpret(y, "int32x64")
                                nan = S.vcmps(S.vand(bits, S.vdup(F32_ABS, "int32")), F32_INF, op="gt")
                                sign = S.vand(S.vshrs(bits, 24), S.vdup(0x80, "int32"))
                                code = S.vsel(S.vor(sign, S.vdup(0x7F, "int32")), code, nan)
                            S.vsts(q[r, c * LANES], TK.reinterpret(code, "uint32x64"), dist="PK4_B32")
                sh.copy(q, Q[tm * block_m, tk * TOKEN_CAST_COLUMNS])
                sh.copy(sf, SF[tm * block_m, tk * groups])

    return token_cast


def token_cast(x, block_m: int, patch_nan: bool, target: str = "ascend-sim"):
    """(codes, scales) of ``build_token_cast`` for bf16 ``x``."""
    m, k = x.shape
    q = x.new_empty((m, k), dtype=torch.uint8)
    sf = x.new_empty((m, -(-k // GROUP)), dtype=torch.float32)
    cached_kernel(build_token_cast, (block_m, patch_nan), target, simd_parallel=False)(x, q, sf)
    return q, sf


# One kernel per family of vector instructions: a single core loads ROWS rows of each input
# register (given as int32 bit patterns), applies every op of the family's table to each row and
# stores each result as 64 int32 bit patterns (a predicate as 0/1 per 32-bit lane), so that a test
# checks every op against its own reference.
ROWS = 8
COMPARES = ("eq", "ne", "gt", "ge", "lt", "le")
ROUNDS = ("ROUND_R", "ROUND_A", "ROUND_F", "ROUND_C", "ROUND_Z")
# Predicates every family kernel binds (a pset must be bound before use): name -> (lane bits, pattern).
PATTERNS = {"every": (32, "PAT_ALL"), "vl16": (32, "PAT_VL16"), "m3": (32, "PAT_M3"), "m4": (32, "PAT_M4"),
            "low_half": (32, "PAT_H"), "low_quarter": (32, "PAT_Q"), "none": (32, "PAT_ALLF"),
            "b16_vl16": (16, "PAT_VL16"), "b8_all": (8, "PAT_ALL")}
S = TA.simd


def as_bits(value):
    """A register as 64 int32 lanes: a predicate as 0/1 per 32-bit lane, anything else reinterpreted."""
    dtype = str(value.dtype)
    if dtype == "boolx256":
        return S.vsel(S.vdup(1, "int32"), S.vdup(0, "int32"), value)
    return value if dtype == "int32x64" else TA.reinterpret(value, "int32x64")


# Macros, so that the accumulator is a register variable the builder assigns to.
@TA.macro
def merged_add(a, b):
    acc = S.alloc_var("float32")
    acc = S.vdup(TA.float32(7.0), "float32")
    acc = S.vadd(a, b, mask=S.vcmp(a, b, op="lt"), mode="MODE_MERGING")
    return acc


@TA.macro
def fused(kind, a, b):
    acc = S.alloc_var("float32")
    acc = S.vdup(TA.float32(0.75), "float32")
    if kind == "mula":
        S.vmula(acc, a, b)
    elif kind == "madd":
        S.vmadd(acc, a, b)
    else:
        S.vaxpy(acc, a, TA.float32(3.0))
    return acc


def _float_ops():
    f32 = TA.float32
    return [
        ("add", lambda v: S.vadd(v.a, v.b)),
        ("sub", lambda v: S.vsub(v.a, v.b)),
        ("mul", lambda v: S.vmul(v.a, v.b)),
        ("div", lambda v: S.vdiv(v.a, v.b)),
        ("sqrt", lambda v: S.vsqrt(v.a)),
        ("max", lambda v: S.vmax(v.a, v.b)),
        ("min", lambda v: S.vmin(v.a, v.b)),
        ("abs", lambda v: S.vabs(v.a)),
        ("neg", lambda v: S.vneg(v.a)),
        ("adds", lambda v: S.vadds(v.a, f32(1.5))),
        ("muls", lambda v: S.vmuls(v.a, f32(-3.0))),
        ("maxs", lambda v: S.vmaxs(v.a, f32(0.0))),
        ("mins", lambda v: S.vmins(v.a, f32(-0.0))),
        *((kind, lambda v, kind=kind: fused(kind, v.a, v.b)) for kind in ("mula", "madd", "axpy")),
        ("add_merging", lambda v: merged_add(v.a, v.b)),
        ("select_gt", lambda v: S.vsel(v.a, v.b, S.vcmp(v.a, v.b, op="gt"))),
        *((f"cmp_{op}", lambda v, op=op: S.vcmp(v.a, v.b, op=op)) for op in COMPARES),
        *((f"cmps_{op}", lambda v, op=op: S.vcmps(v.a, f32(0.0), op=op)) for op in COMPARES),
        ("cadd", lambda v: S.vcadd(v.a)),
        ("cadd_vl16", lambda v: S.vcadd(v.a, mask=v.vl16)),
        ("cmax", lambda v: S.vcmax(v.a)),
        ("cmin", lambda v: S.vcmin(v.a)),
        ("cmax_m3", lambda v: S.vcmax(v.a, mask=v.m3)),
        ("cmin_none", lambda v: S.vcmin(v.a, mask=v.none)),
        ("cgadd", lambda v: S.vcgadd(v.a)),
        ("cgmax", lambda v: S.vcgmax(v.a)),
        ("cgmin_m3", lambda v: S.vcgmin(v.a, mask=v.m3)),
        ("cpadd_m3", lambda v: S.vcpadd(v.a, mask=v.m3)),
        ("dup", lambda v: S.vdup(f32(2.5), "float32")),
        ("ci", lambda v: S.vci(f32(-0.5), "float32")),
    ]


def _u32(value):
    return TA.reinterpret(value, "uint32x64")


def _positive(v):
    return S.vcmps(v.i, 0, op="gt")


def _odd(v):
    return S.vcmps(S.vand(v.j, S.vdup(1, "int32")), 1, op="eq")


def _int_ops():
    return [
        ("add", lambda v: S.vadd(v.i, v.j)),
        ("sub", lambda v: S.vsub(v.i, v.j)),
        ("mul", lambda v: S.vmul(v.i, v.j)),
        ("max", lambda v: S.vmax(v.i, v.j)),
        ("min", lambda v: S.vmin(v.i, v.j)),
        ("max_u32", lambda v: S.vmax(_u32(v.i), _u32(v.j))),
        ("abs", lambda v: S.vabs(v.i)),
        ("neg", lambda v: S.vneg(v.i)),
        ("adds", lambda v: S.vadds(v.i, 7)),
        ("muls", lambda v: S.vmuls(v.i, -3)),
        ("maxs", lambda v: S.vmaxs(v.i, -5)),
        ("mins", lambda v: S.vmins(v.i, 5)),
        ("and", lambda v: S.vand(v.i, v.j)),
        ("or", lambda v: S.vor(v.i, v.j)),
        ("xor", lambda v: S.vxor(v.i, v.j)),
        ("not", lambda v: S.vnot(v.i)),
        ("shl", lambda v: S.vshl(v.i, v.s)),
        ("shr", lambda v: S.vshr(v.i, v.s)),
        ("shl_u32", lambda v: S.vshl(_u32(v.i), v.s)),  # the amount register is signed
        ("shr_u32", lambda v: S.vshr(_u32(v.i), v.s)),
        ("shls", lambda v: S.vshls(v.i, 3)),
        ("shrs", lambda v: S.vshrs(v.i, 3)),
        ("shrs_u32", lambda v: S.vshrs(_u32(v.i), 3)),
        *((f"cmp_{op}", lambda v, op=op: S.vcmp(v.i, v.j, op=op)) for op in COMPARES),
        *((f"cmps_{op}", lambda v, op=op: S.vcmps(v.i, 0, op=op)) for op in COMPARES),
        ("cmps_lt_u32", lambda v: S.vcmps(_u32(v.i), 0x80000000, op="lt")),
        ("pand", lambda v: S.pand(_positive(v), _odd(v), v.every)),
        ("por", lambda v: S.por(_positive(v), _odd(v), v.every)),
        ("pxor", lambda v: S.pxor(_positive(v), _odd(v), v.every)),
        ("pnot", lambda v: S.pnot(_positive(v), v.every)),
        ("pnot_vl16", lambda v: S.pnot(_positive(v), v.vl16)),
        ("psel", lambda v: S.psel(_positive(v), _odd(v), v.m3)),
        *((f"pset_{name}", lambda v, name=name: getattr(v, name)) for name in PATTERNS),
        ("update_mask", lambda v: S.update_mask(v.row * 9 + 3, 32)),
        ("add_masked", lambda v: S.vadd(v.i, v.j, mask=v.m3)),
        ("cadd", lambda v: S.vcadd(v.i)),
        ("cmax", lambda v: S.vcmax(v.i)),
        ("cmin_u32", lambda v: S.vcmin(_u32(v.i))),
        ("cmax_m4", lambda v: S.vcmax(v.i, mask=v.m4)),
        ("cgmax", lambda v: S.vcgmax(v.i)),
        ("ci", lambda v: S.vci(-3, "int32")),
        ("ci_desc", lambda v: S.vci(100, "int32", order="DEC_ORDER")),
        ("dup", lambda v: S.vdup(-123, "int32")),
    ]


def _convert_ops():
    f16 = lambda v: TA.reinterpret(v.h, "float16x128")  # noqa: E731
    return [
        *((f"f32_bf16_{r}", lambda v, r=r: S.vcvt(v.a, "bfloat16", round=r)) for r in ROUNDS),
        ("f32_bf16_odd", lambda v: S.vcvt(v.a, "bfloat16", part=1)),
        ("f32_bf16_nosat", lambda v: S.vcvt(v.a, "bfloat16", sat=False)),
        *((f"f32_f16_{r}", lambda v, r=r: S.vcvt(v.a, "float16", round=r)) for r in (*ROUNDS, "ROUND_O")),
        ("f32_f16_nosat_odd", lambda v: S.vcvt(v.a, "float16", sat=False, part=1)),
        *((f"f32_e4m3_p{p}", lambda v, p=p: S.vcvt(v.a, "float8_e4m3fn", part=p)) for p in range(4)),
        ("f32_e4m3_nosat", lambda v: S.vcvt(v.a, "float8_e4m3fn", sat=False)),
        ("f32_e5m2_p1", lambda v: S.vcvt(v.a, "float8_e5m2", part=1)),
        ("f32_e5m2_nosat", lambda v: S.vcvt(v.a, "float8_e5m2", sat=False)),
        *((f"f32_s32_{r}", lambda v, r=r: S.vcvt(v.a, "int32", round=r)) for r in ROUNDS),
        ("f32_s32_nosat", lambda v: S.vcvt(v.a, "int32", sat=False)),
        ("s32_f32_R", lambda v: S.vcvt(v.i, "float32")),
        ("s32_f32_Z", lambda v: S.vcvt(v.i, "float32", round="ROUND_Z")),
        ("bf16_f32_even", lambda v: S.vcvt(v.h, "float32")),
        ("bf16_f32_odd", lambda v: S.vcvt(v.h, "float32", part=1)),
        ("f16_f32_odd", lambda v: S.vcvt(f16(v), "float32", part=1)),
        *((f"e4m3_f32_p{p}", lambda v, p=p: S.vcvt(TA.reinterpret(v.i, "float8_e4m3fnx256"), "float32", part=p))
          for p in range(4)),
        ("e5m2_f32_p3", lambda v: S.vcvt(TA.reinterpret(v.i, "float8_e5m2x256"), "float32", part=3)),
        ("bf16_f16_Z", lambda v: S.vcvt(v.h, "float16", round="ROUND_Z")),
        ("bf16_f16_nosat", lambda v: S.vcvt(v.h, "float16", sat=False)),
        ("f16_bf16_C", lambda v: S.vcvt(f16(v), "bfloat16", round="ROUND_C")),
        ("bf16_s32_F_odd", lambda v: S.vcvt(v.h, "int32", round="ROUND_F", part=1)),
        *((f"bf16_e2m1_p{p}", lambda v, p=p: S.vcvt(v.h, "float4_e2m1fn", part=p)) for p in (0, 3)),
        ("bf16_e2m1_Z_p1", lambda v: S.vcvt(v.h, "float4_e2m1fn", round="ROUND_Z", part=1)),
        ("e2m1_bf16_p2", lambda v: S.vcvt(TA.reinterpret(v.i, "float4_e2m1fnx512"), "bfloat16", part=2)),
        ("f32_bf16_m3", lambda v: S.vcvt(v.a, "bfloat16", mask=v.m3)),
        ("bf16_f32_b16_vl16_odd", lambda v: S.vcvt(v.h, "float32", mask=v.b16_vl16, part=1)),
    ]


LANE_BITS = {"uint32": 32, "float32": 32, "uint16": 16, "uint8": 8}
# The rearranging instructions' element types, by the names of their ops.
REARRANGED = {"u32": "uint32", "f32": "float32", "u16": "uint16", "u8": "uint8"}


def _view(value, elem: str):
    """A register reinterpreted as lanes of ``elem``."""
    return TA.reinterpret(value, f"{elem}x{2048 // LANE_BITS[elem]}")


def _rearrange_ops():
    ops = [(f"selr_{name}", lambda v, elem=elem: S.vselr(_view(v.a, elem), _view(v.idx, f"uint{LANE_BITS[elem]}")))
           for name, elem in REARRANGED.items()]
    ops += [("dupv", lambda v: S.vdupv(_view(v.a, "float32"))),
            ("dupv_m3", lambda v: S.vdupv(v.a, mask=v.m3)),
            ("dupv_u16", lambda v: S.vdupv(_view(v.a, "uint16")))]
    for kind, fn in (("intlv", S.vintlv), ("dintlv", S.vdintlv)):
        for name, elem in REARRANGED.items():
            ops += [(f"{kind}_{name}_{k}", lambda v, fn=fn, elem=elem, k=k: fn(_view(v.a, elem), _view(v.b, elem))[k])
                    for k in (0, 1)]
    return ops


# family -> (input registers as (field, dtype), op table)
FAMILIES = {
    "float": ((("a", "float32x64"), ("b", "float32x64")), _float_ops),
    "int": ((("i", "int32x64"), ("j", "int32x64"), ("s", "int32x64")), _int_ops),
    "convert": ((("a", "float32x64"), ("i", "int32x64"), ("h", "bfloat16x128")), _convert_ops),
    "rearrange": ((("a", "int32x64"), ("b", "int32x64"), ("idx", "uint32x64")), _rearrange_ops),
}


def family_ops(family: str) -> list[str]:
    return [name for name, _ in FAMILIES[family][1]()]


def build_family(family: str, target: str):
    assert target == "ascend"
    inputs, table = FAMILIES[family]
    ops = table()
    sh = Shell(target)
    TK = sh.T

    @TK.prim_func
    def vector_family(X: TK.Tensor((len(inputs), ROWS, LANES), "int32"),
                      Y: TK.Tensor((ROWS, len(ops), LANES), "int32")):
        with sh.kernel(1):
            x = sh.tile((len(inputs), ROWS, LANES), "int32")
            y = sh.tile((ROWS, len(ops), LANES), "int32")
            sh.copy(X, x)
            with sh.vector(SIMD):
                every = S.pset(*PATTERNS["every"])
                vl16 = S.pset(*PATTERNS["vl16"])
                m3 = S.pset(*PATTERNS["m3"])
                m4 = S.pset(*PATTERNS["m4"])
                low_half = S.pset(*PATTERNS["low_half"])
                low_quarter = S.pset(*PATTERNS["low_quarter"])
                none = S.pset(*PATTERNS["none"])
                b16_vl16 = S.pset(*PATTERNS["b16_vl16"])
                b8_all = S.pset(*PATTERNS["b8_all"])
                for r in TK.serial(ROWS):
                    registers = {field: S.vld(x[k, r, 0]) if dtype == "int32x64" else
                                 TK.reinterpret(S.vld(x[k, r, 0]), dtype) for k, (field, dtype) in enumerate(inputs)}
                    v = SimpleNamespace(row=r, every=every, vl16=vl16, m3=m3, m4=m4, low_half=low_half,
                                        low_quarter=low_quarter, none=none, b16_vl16=b16_vl16, b8_all=b8_all,
                                        **registers)
                    for n, (_, op) in enumerate(ops):
                        S.vsts(y[r, n, 0], as_bits(op(v)))
            sh.copy(y, Y)

    return vector_family


def run_family(family: str, inputs, target: str = "ascend-sim"):
    """The family kernel's results, ``(ROWS, ops, 64)`` int32, for ``inputs`` ``(fields, ROWS, 64)`` int32."""
    out = torch.empty((ROWS, len(family_ops(family)), LANES), dtype=torch.int32, device=inputs.device)
    cached_kernel(build_family, family, target, simd_parallel=False)(inputs, out)
    return out


# The memory family: every load distribution reads the byte image W (given as u8, u16 and u32
# tiles holding the same bytes) and its register goes to a row of L; the stores write into O8,
# O16 and O32, which start as copies of the sentinel images Z8, Z16 and Z32 so that bytes a store
# leaves alone stay visible; the last row of L reads back, after a mem_bar, what a store wrote.
IMAGE_BYTES = 1024
STORE_ROWS = 4
# name -> (tile dtype, element offset, dist); alignments per the LoadAlign distribution table.
LOADS = {
    "norm_b32": ("uint32", 8, "NORM"),
    "unpk_b8": ("uint8", 32, "UNPK_B8"),
    "unpk_b16": ("uint16", 16, "UNPK_B16"),
    "unpk_b32": ("uint32", 24, "UNPK_B32"),
    "unpk4_b8": ("uint8", 96, "UNPK4_B8"),
    "brc_b8": ("uint8", 37, "BRC_B8"),
    "brc_b16": ("uint16", 5, "BRC_B16"),
    "brc_b32": ("uint32", 3, "BRC_B32"),
    "us_b8": ("uint8", 64, "US_B8"),
    "us_b16": ("uint16", 48, "US_B16"),
    "ds_b8": ("uint8", 0, "DS_B8"),
    "ds_b16": ("uint16", 0, "DS_B16"),
    "blk": ("uint8", 160, "BLK"),
    "e2b_b16": ("uint16", 8, "E2B_B16"),
    "e2b_b32": ("uint32", 8, "E2B_B32"),
}
PREDICATE_LOADS = {"pld_norm": (8, "NORM"), "pld_us": (12, "US"), "pld_ds": (16, "DS")}  # u32 offset, dist
LOAD_ROWS = [*LOADS, "dintlv_b32_even", "dintlv_b32_odd", "dintlv_b16_odd", *PREDICATE_LOADS, "read_back"]


def build_memory(spec, target: str):
    assert spec is None and target == "ascend"
    sh = Shell(target)
    TK = sh.T
    n = IMAGE_BYTES

    @TK.prim_func
    def vector_memory(W8: TK.Tensor((n,), "uint8"), W16: TK.Tensor((n // 2,), "uint16"),
                      W32: TK.Tensor((n // 4,), "uint32"), Z8: TK.Tensor((STORE_ROWS, 256), "uint8"),
                      Z16: TK.Tensor((STORE_ROWS, 128), "uint16"), Z32: TK.Tensor((STORE_ROWS, 64), "uint32"),
                      L: TK.Tensor((len(LOAD_ROWS), LANES), "int32"), O8: TK.Tensor((STORE_ROWS, 256), "uint8"),
                      O16: TK.Tensor((STORE_ROWS, 128), "uint16"), O32: TK.Tensor((STORE_ROWS, 64), "uint32")):
        with sh.kernel(1):
            w = {"uint8": sh.tile((n,), "uint8"), "uint16": sh.tile((n // 2,), "uint16"),
                 "uint32": sh.tile((n // 4,), "uint32")}
            o8 = sh.tile((STORE_ROWS, 256), "uint8")
            o16 = sh.tile((STORE_ROWS, 128), "uint16")
            o32 = sh.tile((STORE_ROWS, 64), "uint32")
            loaded = sh.tile((len(LOAD_ROWS), LANES), "int32")
            sh.copy(W8, w["uint8"])
            sh.copy(W16, w["uint16"])
            sh.copy(W32, w["uint32"])
            sh.copy(Z8, o8)
            sh.copy(Z16, o16)
            sh.copy(Z32, o32)
            with sh.vector(SIMD):
                m3 = S.pset(32, "PAT_M3")
                vl16 = S.pset(32, "PAT_VL16")
                b16_m3 = S.pset(16, "PAT_M3")
                for row, (dtype, offset, dist) in enumerate(LOADS.values()):
                    S.vsts(loaded[row, 0], as_bits(S.vld(w[dtype][offset], dist=dist)))
                even, odd = S.vld2(w["uint32"][0], dist="DINTLV_B32")
                S.vsts(loaded[len(LOADS), 0], as_bits(even))
                S.vsts(loaded[len(LOADS) + 1, 0], as_bits(odd))
                _, odd16 = S.vld2(w["uint16"][256], dist="DINTLV_B16")
                S.vsts(loaded[len(LOADS) + 2, 0], as_bits(odd16))
                for k, (offset, dist) in enumerate(PREDICATE_LOADS.values()):
                    S.vsts(loaded[len(LOADS) + 3 + k, 0], as_bits(S.pld(w["uint32"][offset], dist=dist)))
                image = S.vld(w["uint32"][64])
                S.vsts(o32[0, 0], image, mask=m3)
                S.vsts(o32[1, 5], image, dist="ONEPT_B32")
                S.vsts(o8[1, 13], S.vld(w["uint8"][256]), dist="ONEPT_B8")
                S.vsts(o16[1, 64], S.vld(w["uint16"][256]), mask=b16_m3, dist="PK_B16")
                S.vsts(o32[2, 0], image, mask=vl16, dist="PK_B32")
                S.vsts(o32[2, 32], image, dist="PK4_B32")
                S.vsts(o8[2, 0], S.vld(w["uint8"][512]), mask=m3)
                S.pst(o32[3, 0], S.pld(w["uint32"][8]), dist="NORM")
                S.pst(o32[3, 16], S.pld(w["uint32"][12], dist="US"), dist="PK")
                S.mem_bar("VST_VLD")
                S.vsts(loaded[len(LOAD_ROWS) - 1, 0], as_bits(S.vld(o32[0, 0])))
            sh.copy(loaded, L)
            sh.copy(o8, O8)
            sh.copy(o16, O16)
            sh.copy(o32, O32)

    return vector_memory


def run_memory(image, sentinel, target: str = "ascend-sim"):
    """(loads, [o8, o16, o32]) of the memory kernel for a byte ``image`` and a sentinel byte image."""
    views = [image.view(t) for t in (torch.uint8, torch.uint16, torch.uint32)]
    zs = [sentinel.view(t).reshape(STORE_ROWS, -1) for t in (torch.uint8, torch.uint16, torch.uint32)]
    loads = torch.empty((len(LOAD_ROWS), LANES), dtype=torch.int32, device=image.device)
    outs = [torch.empty_like(z) for z in zs]
    cached_kernel(build_memory, None, target, simd_parallel=False)(*views, *zs, loads, *outs)
    return loads, outs


# The gather family: UB gathers (vgather2) read tables W32 / WF / W16 (one byte image as uint32,
# float32 and uint16) at per-lane element indices, from a 32-byte aligned base past the tile's
# start; the masked gathers take their own indices IM32 / IM16, whose inactive lanes point far
# past the UB allocation. Scatters (vscatter) write the table's first register into O32 / O16,
# which start as the sentinel images Z32 / Z16, at the indices S32 / S16; after a mem_bar a
# gather reads the scattered tile back.
GATHER_TABLE_BYTES = 2048
GATHER_ROWS = 4  # index registers per gather kind
GATHER_BASE = 32  # bytes from a tile's start to the base of its gathers and scatters
SCATTER_BYTES = 1024
GATHERS = ["g32", "gf32_m3", "g16", "g16_m3"]
GATHER_OUT_ROWS = [f"{name}_{r}" for name in GATHERS for r in range(GATHER_ROWS)] + ["read_back"]


def build_gather(spec, target: str):
    assert spec is None and target == "ascend"
    sh = Shell(target)
    TK = sh.T
    n, m, rows = GATHER_TABLE_BYTES, SCATTER_BYTES, GATHER_ROWS

    @TK.prim_func
    def vector_gather(W32: TK.Tensor((n // 4,), "uint32"), WF: TK.Tensor((n // 4,), "float32"),
                      W16: TK.Tensor((n // 2,), "uint16"), I32: TK.Tensor((rows, LANES), "uint32"),
                      IM32: TK.Tensor((rows, LANES), "uint32"), I16: TK.Tensor((rows, 2 * LANES), "uint16"),
                      IM16: TK.Tensor((rows, 2 * LANES), "uint16"), S32: TK.Tensor((LANES,), "uint32"),
                      S16: TK.Tensor((2 * LANES,), "uint16"), Z32: TK.Tensor((m // 4,), "uint32"),
                      Z16: TK.Tensor((m // 2,), "uint16"), G: TK.Tensor((len(GATHER_OUT_ROWS), LANES), "int32"),
                      O32: TK.Tensor((m // 4,), "uint32"), O16: TK.Tensor((m // 2,), "uint16")):
        with sh.kernel(1):
            w32, wf, w16 = sh.tile((n // 4,), "uint32"), sh.tile((n // 4,), "float32"), sh.tile((n // 2,), "uint16")
            i32, im32 = sh.tile((rows, LANES), "uint32"), sh.tile((rows, LANES), "uint32")
            i16, im16 = sh.tile((rows, 2 * LANES), "uint16"), sh.tile((rows, 2 * LANES), "uint16")
            s32, s16 = sh.tile((LANES,), "uint32"), sh.tile((2 * LANES,), "uint16")
            o32, o16 = sh.tile((m // 4,), "uint32"), sh.tile((m // 2,), "uint16")
            g = sh.tile((len(GATHER_OUT_ROWS), LANES), "int32")
            # One copy per tensor, written out: the emitted entry names its parameters after them.
            sh.copy(W32, w32)
            sh.copy(WF, wf)
            sh.copy(W16, w16)
            sh.copy(I32, i32)
            sh.copy(IM32, im32)
            sh.copy(I16, i16)
            sh.copy(IM16, im16)
            sh.copy(S32, s32)
            sh.copy(S16, s16)
            sh.copy(Z32, o32)
            sh.copy(Z16, o16)
            with sh.vector(SIMD):
                m3 = S.pset(32, "PAT_M3")
                b16_m3 = S.pset(16, "PAT_M3")
                for r in range(rows):
                    gathered = (S.vgather2(w32[GATHER_BASE // 4], S.vld(i32[r, 0])),
                                S.vgather2(wf[GATHER_BASE // 4], S.vld(im32[r, 0]), m3),
                                S.vgather2(w16[GATHER_BASE // 2], S.vld(i16[r, 0])),
                                S.vgather2(w16[GATHER_BASE // 2], S.vld(im16[r, 0]), b16_m3))
                    for k, value in enumerate(gathered):
                        S.vsts(g[k * rows + r, 0], as_bits(value))
                S.vscatter(S.vld(w32[0]), o32[GATHER_BASE // 4], S.vld(s32[0]), m3)
                S.vscatter(S.vld(w16[0]), o16[GATHER_BASE // 2], S.vld(s16[0]))
                S.mem_bar("VST_VLD")
                S.vsts(g[len(GATHER_OUT_ROWS) - 1, 0], S.vgather2(o32[GATHER_BASE // 4], S.vld(s32[0])))
            sh.copy(g, G)
            sh.copy(o32, O32)
            sh.copy(o16, O16)

    return vector_gather


def run_gather(*inputs, target: str = "ascend-sim"):
    """(gathered registers, O32, O16) of the gather kernel for its inputs W32 ... Z16 (as named there)."""
    out = torch.empty((len(GATHER_OUT_ROWS), LANES), dtype=torch.int32, device=inputs[0].device)
    o32, o16 = torch.empty_like(inputs[-2]), torch.empty_like(inputs[-1])
    cached_kernel(build_gather, None, target, simd_parallel=False)(*inputs, out, o32, o16)
    return out, o32, o16


# ``counted``: each of COUNTED_CORES cores loads COUNTED_ROWS rows of X, adds x[r, 1] to row r in
# a vector function, scales it by x[r, 0] in a SIMT region (one element per thread) and writes
# y[1, 63] = x[0, 5] + x[1, 7] in scalar code; execution counts follow from this structure.
COUNTED_CORES = 3
COUNTED_ROWS = SIMT_THREADS // LANES


def build_counted(spec, target: str):
    assert spec is None and target == "ascend"
    sh = Shell(target)
    TK = sh.T
    rows = COUNTED_ROWS

    @TK.prim_func
    def counted(X: TK.Tensor((COUNTED_CORES * rows, LANES), "float32"),
                Y: TK.Tensor((COUNTED_CORES * rows, LANES), "float32")):
        with sh.kernel(COUNTED_CORES) as core:
            x, t, y = (sh.tile((rows, LANES), "float32") for _ in range(3))
            sh.copy(X[core * rows, 0], x)
            with sh.vector(SIMD):
                every = S.pset(32, "PAT_ALL")
                for r in TK.serial(rows):
                    S.vsts(t[r, 0], S.vadds(S.vld(x[r, 0]), x[r, 1], mask=every), mask=every)
                S.mem_bar("VST_VLD")
            with sh.vector(SIMT):
                for i, j in T.Parallel(rows, LANES):
                    y[i, j] = t[i, j] * x[i, 0]
            y[1, LANES - 1] = x[0, 5] + x[1, 7]
            sh.copy(y, Y[core * rows, 0])

    return counted


def counted_kernel(target: str = "ascend-sim"):
    return cached_kernel(build_counted, None, target, simd_parallel=False)
