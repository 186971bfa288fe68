"""The inputs and sizes the ``vmi`` command generates, shared by several ops (each op's own are
beside its ``Command`` in its module)."""

from __future__ import annotations

import torch

from vmi_core.library import support
from vmi_core.tools.testing import generator, randn

from ..config import get_token_alignment

IN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168), (1, 7168), (4, 7168), (16, 7168))
# per_block_cast(_lossless) and per_channel_cast need M and K multiples of 128: no decode sizes.
BLOCK_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168))

PARALLEL_SUPPORT = support("SIMD and SIMT vector regions",
                           cpu="bit-exact against the reference in both flavors, every option")

SWIGLU_CLAMP = 10.0


def plain_inputs(shape, options, seed):
    """``x`` of the option ``in_dtype``."""
    return {"x": randn(shape, seed, IN_DTYPES[options["in_dtype"]])}


def swiglu_psum(num_rows: int, experts: int, seed: int) -> torch.Tensor:
    """A psum layout of ``experts`` experts over every row: each expert's token count a multiple of
    the token alignment (so no row is padding and every output element is defined), the rows not
    a multiple of it in the last expert."""
    alignment = get_token_alignment()
    blocks = num_rows // alignment
    cuts = torch.sort(torch.randint(0, blocks + 1, (experts - 1,), generator=generator(seed))).values
    ends = torch.cat([cuts * alignment, torch.tensor([num_rows])])
    return ends.to(torch.int32)


def on_meta(value):
    """``value`` with its tensors (also within tuples, lists and dicts) as meta tensors: what a
    dispatch's validation needs to make its kernel's specialisation, without data."""
    if isinstance(value, torch.Tensor):
        storage = torch.empty(value.untyped_storage().nbytes() // value.element_size(), dtype=value.dtype,
                              device="meta")
        return storage.as_strided(value.shape, value.stride(), value.storage_offset())
    if isinstance(value, (tuple, list)):
        return type(value)(on_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: on_meta(v) for k, v in value.items()}
    return value


def meta(shape, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of ``shape`` and ``dtype``."""
    return torch.empty(shape, dtype=dtype, device="meta")
