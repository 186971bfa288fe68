"""``cast`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

The tensor is processed as a flat vector: work tiles of ``BLOCK`` elements go
round-robin to persistent workers. Per tile:

1. DMA the input tile into an on-chip tile (the last tile is clamped);
2. per element: decode to fp32, round and encode to the output format; with
   stochastic rounding, first one hash per quad of four elements, then each
   element rounds with its 16 bits of its quad's hash;
3. DMA the output tile out.

A same-format cast has no vector region: its tiles go from the input DMA straight
to the output DMA. On Ascend, the conversion runs as explicit vector code (a SIMD region,
``vmi_core.tl.vector``); with stochastic rounding the quad hashes are computed 64 quads at
a time, each quad's four elements deinterleaved into the same lane of four registers.

The element count is a runtime value (one compiled kernel per format pair); the
launcher cuts huge tensors into chunks that int32 indexing covers and hands every
chunk the quad index it starts at, the stochastic-rounding counter, mod 2^32.
"""


from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, Vec, bitcast
from vmi_core.tl.stochastic import sr_mix, sr_random16_at, stochastic_round
from vmi_core.tl.vector import deinterleave, load, phase_barrier, store

from .common import KERNEL_DTYPE

FORMATS = ("fp32", "bf16", "e4m3")
STOCHASTIC_PAIRS = (("fp32", "bf16"), ("fp32", "e4m3"), ("bf16", "e4m3"))
# Elements per work tile: a multiple of 4 (whole quads), small enough for CPU stack
# arrays and, double-buffered, a fraction of the Ascend UB.
BLOCK = 4096
# Elements per launch: tile offsets stay far below 2^31 (int32 indexing).
CHUNK = 1 << 30


@dataclass(frozen=True)
class CastSpec:
    """Everything a cast kernel is specialised on (the element count is a runtime value)."""

    in_fmt: str
    out_fmt: str
    stochastic: bool = False

    def __post_init__(self) -> None:
        if self.in_fmt not in FORMATS or self.out_fmt not in FORMATS:
            raise ValueError(f"formats must be in {FORMATS}, got {(self.in_fmt, self.out_fmt)}")
        if self.stochastic and (self.in_fmt, self.out_fmt) not in STOCHASTIC_PAIRS:
            raise ValueError(f"stochastic rounding supports only {STOCHASTIC_PAIRS}, "
                             f"got {(self.in_fmt, self.out_fmt)}")

    @property
    def copy_only(self) -> bool:
        return self.in_fmt == self.out_fmt


def to_f32(fmt: str, value):
    """A stored element of ``fmt`` (fp32, or bf16/E4M3 bits) as fp32."""
    if fmt == "fp32":
        return value
    if fmt == "bf16":
        return F.bf16_to_f32(value)
    return F.e4m3_to_f32(value)


def from_f32(fmt: str, y):
    """fp32 ``y`` in ``fmt``, round to nearest even (E4M3 saturating)."""
    if fmt == "fp32":
        return y
    if fmt == "bf16":
        return F.f32_to_bf16(y)
    return F.f32_to_e4m3(y)


def _kernel_config(spec: CastSpec) -> dict:
    # SIMT regions access 8-bit E4M3 data element by element; SIMD regions are explicit vector code.
    return {"simt_8bit": "e4m3" in (spec.in_fmt, spec.out_fmt), "simd_parallel": False}


@kernel(config=_kernel_config)
def build_cast(spec: CastSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    in_dtype, out_dtype = KERNEL_DTYPE[spec.in_fmt], KERNEL_DTYPE[spec.out_fmt]
    N = TK.dynamic("N")

    def converted(x, at):
        return from_f32(spec.out_fmt, to_f32(spec.in_fmt, at.load(x)))

    def rounded(x, h, at):
        # Element p of a quad rounds with the p-th 16-bit number of the quad's hash.
        r16 = sr_random16_at(at.group(h, 4), bitcast(at.column(), "uint32") & F.u32(3))
        return from_f32(spec.out_fmt, stochastic_round(to_f32(spec.in_fmt, at.load(x)), r16, spec.out_fmt))

    def wide_bits(x, j):
        """The bit pattern of element ``j`` widened to fp32 (what the stochastic-rounding hash reads)."""
        return F.f32_bits(to_f32(spec.in_fmt, x[j]))

    def hash_quad_registers(x, h, quad0, e0):
        bits = [F.f32_bits(to_f32(spec.in_fmt, load(x[e0 + k * LANES]))) for k in range(4)]
        even01, odd01 = deinterleave(bits[0], bits[1])
        even23, odd23 = deinterleave(bits[2], bits[3])
        b0, b2 = deinterleave(even01, even23)
        b1, b3 = deinterleave(odd01, odd23)
        counter = bitcast(Vec.lane_index(e0 // 4), "uint32") + quad0
        T.evaluate(store(h[e0 // 4], sr_mix(b0, b1, b2, b3, counter)))

    @T.macro
    def hash_quads(x, h, quad0):
        if sh.in_simd:
            # 256 elements a step: two rounds of deinterleaving give each quad's four elements
            # in the same lane of four registers.
            for c in T.serial(BLOCK // (4 * LANES)):
                hash_quad_registers(x, h, quad0, c * 4 * LANES)
            phase_barrier()
        else:
            for qd in T.Parallel(BLOCK // 4):
                h[qd] = sr_mix(wide_bits(x, 4 * qd), wide_bits(x, 4 * qd + 1), wide_bits(x, 4 * qd + 2),
                               wide_bits(x, 4 * qd + 3), quad0 + T.Cast("uint32", qd))

    @T.macro
    def convert_stochastic(x, h, o):
        sh.elementwise((BLOCK,), lambda at: rounded(x, h, at), o)

    @T.macro
    def body(X, OUT, quad_base):
        with sh.persistent_kernel() as worker:
            for t in sh.tiles([T.ceildiv(N, BLOCK)], worker):
                # A scalar, not a let binding: TileLang would inline the offset into every access.
                t0 = T.alloc_var("int32")
                t0 = t * BLOCK
                x = sh.tile((BLOCK,), in_dtype)
                if spec.copy_only:
                    sh.buffer_versions({x: 2})
                    sh.copy(X[t0], x)
                    sh.copy(x, OUT[t0])
                else:
                    o = sh.tile((BLOCK,), out_dtype)
                    sh.buffer_versions({x: 2, o: 2})
                    if spec.stochastic:
                        h = sh.lane_table(BLOCK // 4, "uint32")
                        sh.copy(X[t0], x)
                        with sh.vector(SIMD):
                            quad0 = T.alloc_var("uint32")
                            quad0 = T.Cast("uint32", quad_base) + T.Cast("uint32", t * (BLOCK // 4))
                            hash_quads(x, h, quad0)
                            convert_stochastic(x, h, o)
                        sh.copy(o, OUT[t0])
                    else:
                        sh.elementwise_stream([(X[t0], x)], converted, [(o, OUT[t0])])

    if spec.stochastic:
        @TK.prim_func
        def cast_kernel(X: TK.Tensor((N,), in_dtype), OUT: TK.Tensor((N,), out_dtype), quad_base: TK.int32):
            body(X, OUT, quad_base)
    else:
        @TK.prim_func
        def cast_kernel(X: TK.Tensor((N,), in_dtype), OUT: TK.Tensor((N,), out_dtype)):
            body(X, OUT, None)

    return cast_kernel


def quad_base(start: int) -> int:
    """The counter of the quad at element ``start``, mod 2^32, as the int32 a kernel argument holds."""
    base = (start // 4) & 0xFFFFFFFF
    return base - (1 << 32) if base >= 1 << 31 else base


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.cast.CastCall``) on ``target``."""
    spec = call.spec
    x, out = bit_view(call.x.view(-1)), bit_view(call.out.view(-1))

    def run(kernel, start: int, stop: int) -> None:
        for lo in range(start, stop, CHUNK):
            hi = min(lo + CHUNK, stop)
            if spec.stochastic:
                kernel(x[lo:hi], out[lo:hi], quad_base(lo))
            else:
                kernel(x[lo:hi], out[lo:hi])

    build_cast.launch_rows(spec, target, call.x.numel(), run, align=BLOCK, min_rows=16 * BLOCK)
