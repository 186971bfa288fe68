"""``mhc_multilayer_recompute`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

The kernel rebuilds, for a run of ``L`` layers, every layer input and every carried residual from
``R_0``, the saved mixes and the saved sublayer outputs: per layer ``l`` exactly
``mhc_pre_apply_mix_fwd`` (the stream mix of ``vmi_mhc.tl.mix`` in the flavor's chain, rounded to
bf16) and, for ``l < L_post``, ``mhc_post_fwd`` (``vmi_mhc.tl.post.residual_update``, rounded to
bf16: the rounding of the carried residual). The columns are loaded and stored by the same helpers
as ``post``'s forward, so the bits are those kernels' by construction.

**How the lists reach the kernel.** TileLang 0.1.15 builds a prim_func from a Python signature of
named buffers (no pointer tables on every target, no variable argument count), so each list is
one buffer with a leading layer axis, ``(L, rows, width)``, whose layer stride is a runtime
argument: the list's tensors are addressed where they are when they are equally spaced views of
one storage (``torch.empty(L, ...).unbind(0)``), and stacked into one temporary otherwise (by the
dispatch, ``layer_stack``). The kernel is specialised on ``(n, H, L, L_post, flavor)``; the token
count and the six layer strides are runtime values.

**Work and data flow.** Persistent workers take the work items ``(token, hidden tile)``; a hidden
tile is ``block`` columns (whole 64-lane registers, the last tile clamped by the DMA), the fewest
equal tiles the unified buffer allows. Per item the ``(n, block)`` residual tile stays on chip
across the layers in two slots: layer ``l`` reads slot ``l mod 2`` and writes the new residual into
the other one, which the next layer reads (the layer loop runs over pairs of layers, so each slot
is a buffer of its own). Per layer: DMA the token's pre, post and comb rows and the layer-output
tile in; per column the layer input and the ``n`` new streams; DMA both out. After the last post
layer, when ``L = L_post + 1``, the last layer input is made from the carried residual alone.

On Ascend every phase is explicit SIMD vector code: the mix scalars broadcast into registers once
per layer (``BRC_B32`` loads), bf16 rows unpacked into fp32 lanes and packed back by the stores;
the layer's small tables and its layer-output and layer-input tiles have two versions, so the next
layer's loads overlap the current layer's stores. On cpu and cuda the same arithmetic runs as
``T.Parallel`` loops; on ``cpu`` a call's tokens are split across threads (``vmi_core.cpu_parallel``).
"""

from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, Vec, keep, simd
from vmi_core.tl.vector import phase_barrier

from ..tl.mix import stream_mix
from ..tl.post import residual_update
from .post import MAX_FORWARD_MHC_MULT, _bf16, _store, hidden_block

# The most layers one call recomputes: each layer is six more tensors to validate and address, and
# the runs of layers the recompute is made for are short (TileKernels tests 10).
MAX_LAYERS = 16
# The stream counts of post's forward kernel, whose bits every layer reproduces.
MAX_MHC_MULT = MAX_FORWARD_MHC_MULT
# Ascend unified-buffer budget of a kernel with SIMD regions only (spec mhc §2), the bytes kept for
# the small per-layer tables, the largest hidden tile (TileKernels: 8192, with no second version of
# the first residual slot) and the versions of the per-layer tiles (the loads of layer l + 1
# overlap the stores of layer l).
UB_BYTES = 248 * 1024
TABLE_BYTES = 8 * 1024
MAX_BLOCK = 8192
VERSIONS = 2


@dataclass(frozen=True)
class MultilayerRecomputeSpec:
    """Everything the kernel is specialised on (the token count and layer strides are runtime)."""

    mhc_mult: int
    hidden: int
    num_layers: int
    num_post_layers: int
    flavor: str

    @property
    def block(self) -> int:
        # Bytes per column: the two residual slots of n bf16 rows (the first in two versions: the
        # next item's R_0 loads while this item computes), and the versions of the layer-output and
        # layer-input rows.
        per_column = 2 * (3 * self.mhc_mult + 2 * VERSIONS)
        fit = (UB_BYTES - TABLE_BYTES) // per_column // LANES * LANES
        return hidden_block(self.hidden, min(MAX_BLOCK, fit))


def _weights(table, size: int, vector: bool):
    """``table[0..size)`` of a token's fp32 row: in vector code broadcast into registers."""
    if vector:
        return [keep(Vec(simd().vld(table[k], dist="BRC_B32"))) for k in range(size)]
    return [table[k] for k in range(size)]


def _layer_columns(flavor: str, n: int, res, pres, li, col, vector: bool, update=None):
    """The layer input of the column(s) at ``col`` from the residual tile ``res``, and with
    ``update = (layer_output, posts, combs, new_res)`` the ``n`` streams of the next residual."""
    streams = [_bf16(res, (i, col), vector) for i in range(n)]
    _store(li, (col,), F.f32_to_bf16(stream_mix(flavor, pres, streams)), vector)
    if update is None:
        return
    lo, posts, combs, new_res = update
    x = _bf16(lo, (col,), vector)
    for o in range(n):
        value = residual_update(posts[o], x, [combs[i * n + o] for i in range(n)], streams)
        _store(new_res, (o, col), F.f32_to_bf16(value), vector)


def _layer_registers(flavor: str, n: int, block: int, res, pre, li, tables=None):
    """One layer of a tile in vector code; ``tables = (layer_output, post, comb, new_res)`` for a
    layer with a post update."""
    pres = _weights(pre, n, True)
    update = None
    if tables is not None:
        lo, post, comb, new_res = tables
        update = (lo, _weights(post, n, True), _weights(comb, n * n, True), new_res)
    with T.serial(block // LANES) as c:
        _layer_columns(flavor, n, res, pres, li, c * LANES, True, update)
    phase_barrier()


@kernel(simd_parallel=False)
def build_multilayer_recompute(spec: MultilayerRecomputeSpec, target: str):
    """The kernel's TileLang prim_func of ``spec`` for ``target`` (``spec.num_post_layers >= 1``)."""
    sh = Shell(target)
    TK = sh.T
    n, H, HB = spec.mhc_mult, spec.hidden, spec.block
    L, LP, flavor = spec.num_layers, spec.num_post_layers, spec.flavor
    M = TK.dynamic("M")
    MR = TK.dynamic("MR")
    pre_ls = TK.dynamic("pre_ls", "int64")
    lo_ls = TK.dynamic("lo_ls", "int64")
    post_ls = TK.dynamic("post_ls", "int64")
    comb_ls = TK.dynamic("comb_ls", "int64")
    li_ls = TK.dynamic("li_ls", "int64")
    res_ls = TK.dynamic("res_ls", "int64")

    @T.macro
    def update_lanes(res, pre, li, lo, post, comb, new_res):
        for j in T.Parallel(HB):
            update = (lo, _weights(post, n, False), _weights(comb, n * n, False), new_res)
            _layer_columns(flavor, n, res, _weights(pre, n, False), li, j, False, update)

    @T.macro
    def input_lanes(res, pre, li):
        for j in T.Parallel(HB):
            _layer_columns(flavor, n, res, _weights(pre, n, False), li, j, False)

    @T.macro
    def post_layer(PRE, LO, POST, COMB, LI, RES, layer, t, h0, res, new_res, pre, post, comb, lo, li):
        sh.copy(PRE[layer, t, 0], pre)
        sh.copy(POST[layer, t, 0], post)
        sh.copy(COMB[layer, t, 0], comb)
        sh.copy(LO[layer, t, h0], lo)
        with sh.vector(SIMD):
            if sh.in_simd:
                _layer_registers(flavor, n, HB, res, pre, li, (lo, post, comb, new_res))
            else:
                update_lanes(res, pre, li, lo, post, comb, new_res)
        sh.copy(li, LI[layer, t, h0])
        sh.copy(new_res, RES[layer, t * n, h0])

    @T.macro
    def last_input(PRE, LI, t, h0, res, pre, li):
        sh.copy(PRE[LP, t, 0], pre)
        with sh.vector(SIMD):
            if sh.in_simd:
                _layer_registers(flavor, n, HB, res, pre, li)
            else:
                input_lanes(res, pre, li)
        sh.copy(li, LI[LP, t, h0])

    @TK.prim_func
    def multilayer_recompute_kernel(
        R0: TK.Tensor((MR, H), "uint16"),
        PRE: TK.StridedTensor((L, M, n), (pre_ls, n, 1), "float32"),
        LO: TK.StridedTensor((LP, M, H), (lo_ls, H, 1), "uint16"),
        POST: TK.StridedTensor((LP, M, n), (post_ls, n, 1), "float32"),
        COMB: TK.StridedTensor((LP, M, n * n), (comb_ls, n * n, 1), "float32"),
        LI: TK.StridedTensor((L, M, H), (li_ls, H, 1), "uint16"),
        RES: TK.StridedTensor((LP, MR, H), (res_ls, H, 1), "uint16"),
        pre_ls: TK.int64, lo_ls: TK.int64, post_ls: TK.int64, comb_ls: TK.int64, li_ls: TK.int64,
        res_ls: TK.int64,
    ):
        with sh.persistent_kernel() as worker:
            for t, k in sh.tiles([M, T.ceildiv(H, HB)], worker):
                h0 = T.alloc_var("int32")
                h0 = k * HB
                # The carried residual's two slots: layer l reads res[l mod 2], writes the other.
                res = [sh.tile((n, HB), "uint16"), sh.tile((n, HB), "uint16")]
                pre = sh.tile((n,), "float32")
                post = sh.tile((n,), "float32")
                comb = sh.tile((n * n,), "float32")
                lo = sh.tile((HB,), "uint16")
                li = sh.tile((HB,), "uint16")
                sh.buffer_versions({pre: VERSIONS, post: VERSIONS, comb: VERSIONS, lo: VERSIONS, li: VERSIONS})
                layer_tiles = (pre, post, comb, lo, li)
                sh.copy(R0[t * n, h0], res[0])
                if LP >= 2:
                    for pair in T.serial(LP // 2):
                        layer = T.alloc_var("int32")
                        layer = 2 * pair
                        post_layer(PRE, LO, POST, COMB, LI, RES, layer, t, h0, res[0], res[1], *layer_tiles)
                        layer = 2 * pair + 1
                        post_layer(PRE, LO, POST, COMB, LI, RES, layer, t, h0, res[1], res[0], *layer_tiles)
                if LP % 2:
                    post_layer(PRE, LO, POST, COMB, LI, RES, LP - 1, t, h0, res[0], res[1], *layer_tiles)
                if L > LP:
                    last_input(PRE, LI, t, h0, res[LP % 2], pre, li)

    return multilayer_recompute_kernel


def layer_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The list of equally shaped contiguous tensors as one ``(L, *shape)`` view of their storage
    when they are equally spaced in it in list order without overlapping (``torch.empty(L,
    ...).unbind(0)`` is), else None."""
    first = tensors[0]
    if len(tensors) == 1:
        return first.unsqueeze(0)
    item = first.element_size()
    step, rest = divmod(tensors[1].data_ptr() - first.data_ptr(), item)
    storage = first.untyped_storage().data_ptr()
    if rest or step < first.numel():
        return None
    for layer, tensor in enumerate(tensors):
        if (tensor.untyped_storage().data_ptr() != storage
                or tensor.data_ptr() - first.data_ptr() != layer * step * item):
            return None
    return first.as_strided((len(tensors), *first.shape), (step, *first.stride()))


def layer_stack(tensors: list[torch.Tensor], *, output: bool) -> tuple[torch.Tensor, bool]:
    """``(view, copied)``: the list as one ``(L, *shape)`` tensor for the kernel. Without a
    ``layer_view`` of it, a new stacked tensor (``copied``): the inputs copied in, or, for an
    ``output`` list, uninitialised, to be copied out after the launch."""
    view = layer_view(tensors)
    if view is not None:
        return view, False
    if output:
        return torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype, device=tensors[0].device), True
    return torch.stack(tensors), True


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_mhc.multilayer_recompute.MultilayerRecomputeCall``, with at
    least one token and one post layer) on ``target``: the output lists are written."""
    spec = call.spec
    n, H, num_tokens = spec.mhc_mult, spec.hidden, call.num_tokens
    rows = {
        "pre": [m.reshape(num_tokens, n) for m in call.pre_mix_list],
        "lo": [bit_view(x).view(num_tokens, H) for x in call.layer_output_list],
        "post": [m.reshape(num_tokens, n) for m in call.post_mix_list],
        "comb": [m.reshape(num_tokens, n * n) for m in call.comb_mix_list],
        "li": [bit_view(x).view(num_tokens, H) for x in call.layer_input_list],
        "res": [bit_view(x).view(num_tokens * n, H) for x in call.residual_list],
    }
    stacks = {name: layer_stack(tensors, output=name in ("li", "res")) for name, tensors in rows.items()}
    pre, lo, post, comb, li, res = (stacks[name][0] for name in rows)
    strides = [stacks[name][0].stride(0) for name in rows]
    r0 = bit_view(call.initial_residual).view(num_tokens * n, H)

    def run(kernel, start: int, stop: int) -> None:
        tokens, streams = slice(start, stop), slice(start * n, stop * n)
        kernel(r0[streams], pre[:, tokens], lo[:, tokens], post[:, tokens], comb[:, tokens], li[:, tokens],
               res[:, streams], *strides)

    build_multilayer_recompute.launch_rows(spec, target, num_tokens, run)
    for name in ("li", "res"):
        stacked, copied = stacks[name]
        if copied:
            for layer, tensor in enumerate(rows[name]):
                tensor.copy_(stacked[layer])
