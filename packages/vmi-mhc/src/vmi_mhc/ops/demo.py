"""The inputs and sizes the ``vmi`` command generates, shared by several ops (each op's own are
beside its declaration, in its ``Command``).

Token-major shapes: ``(tokens, hidden)`` for the residual ops (``expand``, ``pre_apply_mix``,
``post``, ``multilayer_recompute``), the ``norm_fn`` stages (``K = 4 · hidden``, ``n3 = 24`` mix
entries), the prenorm GEMM and ``pre_big_fuse`` (4 streams); ``(tokens,)`` for the mix ops
(``head_compute_mix``, ``pre_split_mixes``, ``sinkhorn``). The sources ``vmi source`` shows are
specialised on ``SOURCE_HIDDEN`` where a kernel depends on the hidden size.
"""

from __future__ import annotations

import torch

from vmi_core.library import Option
from vmi_core.tools.testing import generator

from ..inputs import MAX_STREAMS, MHC_MULT, mix_width

# Hidden size of the sources the command shows (kernels specialised on it).
SOURCE_HIDDEN = 4096
NORM_EPS = 1e-6
"""The RMS epsilon of the ``norm_fn`` entries (TileKernels' tests use 1e-6)."""
# TileKernels' test values of pre_split_mixes.
POST_MULT = 2.0
PRE_EPS = 1e-2
# Mix entries n3 of the default 4 streams.
MIX = mix_width(MHC_MULT)

# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
MIX_SHAPES = ((65536,), (8192,), (1001,), (1,), (4,), (16,))
# Prefill sizes (throughput), a decode-size batch and one token.
STREAM_SHAPES = ((8192, 4096), (8192, 7168), (512, 4096), (16, 4096), (1, 4096))
# Prefill sizes at the models' hidden sizes (throughput) and decode sizes (microseconds per call).
RESIDUAL_SHAPES = ((8192, 4096), (4096, 7168), (512, 5120), (1, 4096), (4, 4096), (16, 4096))

STREAM_OPTIONS = (Option("mhc_mult", 4, tuple(range(1, MAX_STREAMS + 1)), "number of residual streams n"),)
SPLITS_OPTIONS = (Option("n_splits", 16, tuple(range(1, 65)),
                         "split-K partials (TileKernels: 16 on CUDA, 1 on Ascend)"),)


def group_size(shape) -> int:
    """The RMS group size ``K = 4 · hidden`` of a ``(tokens, hidden)`` shape."""
    return MHC_MULT * shape[1]


def partials(shape, n_splits, seed):
    """Partials as the prenorm GEMM gives them on unit-variance data with ``fn ~ 1e-2``."""
    tokens, k = shape[0], group_size(shape)
    g = generator(seed)
    out_mul = torch.randn(n_splits, tokens, 1, MIX, generator=g) * (k / n_splits) ** 0.5 * 1e-2
    sqrsums = (0.5 + torch.rand(n_splits, tokens, 1, generator=g)) * (k / n_splits)
    return out_mul, sqrsums


def streams(shape, n, seed):
    """The v1 tests' stream values: sigmoid of normal samples (as a residual after a norm would be)."""
    return torch.sigmoid(torch.randn(shape[0], n, shape[1], generator=generator(seed))).to(torch.bfloat16)
