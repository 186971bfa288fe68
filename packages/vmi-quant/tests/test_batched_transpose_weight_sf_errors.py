"""batched_transpose_weight_sf refuses bad input with an error naming the argument: before any
kernel for shapes, types and reused outputs; after the kernel's check for scales that are not
+0 or a finite positive power of two, naming the weight, with reused outputs left untouched."""

from __future__ import annotations

import pytest
import torch

from vmi_quant.ops.batched_transpose_weight_sf import batched_transpose_weight_sf

# ascend-sim in the slow run: the default run checks its status word in test_batched_transpose_weight_sf.py.
TARGETS = [None, pytest.param("ascend-sim", marks=pytest.mark.slow), "torch"]


def _sf(rows=4, cols=4, groups=None):
    shape = (groups, rows, cols) if groups else (rows, cols)
    return torch.exp2(torch.randint(-10, 10, shape).float())


@pytest.mark.parametrize("args, error, match", [
    (([_sf()], 32, [False, True]), ValueError, "transpose_sf1s must have one entry per weight"),
    (([_sf()], 32, [False], [None, None]), ValueError, "outs must have one entry per weight"),
    (([_sf()], 64, [False]), ValueError, "block_size must be one of"),
    (([_sf()], 32.0, [False]), TypeError, "block_size must be an int"),
    (([_sf()], 32, [1]), TypeError, r"transpose_sf1s\[0\] must be a bool"),
    ((_sf(), 32, [False]), TypeError, "sf must be a sequence"),
    (([_sf().double()], 32, [False]), TypeError, r"sf\[0\] must be torch.float32"),
    (([_sf(), _sf(3, 4)], 32, [False, False]), ValueError, r"sf\[1\]: .* multiples of 128"),
    (([_sf(8, 8)[:, ::2]], 32, [False]), ValueError, r"sf\[0\] must be contiguous"),
    (([torch.ones(4)], 32, [False]), ValueError, r"sf\[0\] must be \(n/bs, k/bs\)"),
    (([torch.ones(0, 4, 4)], 32, [False]), ValueError, "at least one group"),
    (([_sf()], 32, [False], [(torch.zeros(1),)]), TypeError, r"outs\[0\] must be None or an"),
])
def test_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        batched_transpose_weight_sf(*args)


def _reused(sf, transpose=(False,)):
    return batched_transpose_weight_sf(sf, 32, list(transpose))


@pytest.mark.parametrize("change, match", [
    (lambda p: (p[0].to(torch.int32), p[1]), r"outs\[0\] sf0_out must be torch.int16"),
    (lambda p: (p[0], p[1].t()), r"outs\[0\] sf1_out must have shape"),
    (lambda p: (p[0].contiguous(), p[1]), r"outs\[0\] sf0_out must have shape .* and strides"),
    (lambda p: (torch.as_strided(torch.empty(p[0].numel() + 2, dtype=torch.int16), p[0].shape, p[0].stride(), 2),
                p[1]), "32-byte aligned"),
])
def test_reused_outputs_must_match(change, match):
    sf = [_sf()]
    (pair,) = _reused(sf)
    with pytest.raises((TypeError, ValueError), match=match):
        batched_transpose_weight_sf(sf, 32, [False], [change(pair)])


def test_reused_outputs_must_not_overlap():
    sf = [_sf(), _sf()]
    pair, _ = batched_transpose_weight_sf(sf, 32, [False, False])
    with pytest.raises(ValueError, match=r"outs\[0\] sf0_out shares memory with outs\[1\] sf0_out"):
        batched_transpose_weight_sf(sf, 32, [False, False], [pair, pair])


def test_outputs_past_32_bit_offsets():
    # n = 2^19 rows of P0 = 2^12 words: sf0 would hold 2^31 elements (meta scales: no memory needed).
    sf = torch.empty(2**12, 2**13, device="meta")
    with pytest.raises(ValueError, match=r"sf\[0\]: the outputs .* too large for the kernels"):
        batched_transpose_weight_sf([sf], 128, [False])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("value", [3.0, -2.0, -0.0, 2.0**-130, float("inf"), float("nan")])
def test_not_a_power_of_two_names_the_weight(value, target):
    good, bad = _sf(), _sf(8, 4, 2)
    bad[1, 5, 2] = value
    with pytest.raises(ValueError, match=r"sf\[1\] must hold \+0 or positive powers of two"):
        batched_transpose_weight_sf([good, bad], 32, [False, True], target=target)


@pytest.mark.parametrize("target", TARGETS[:2])
def test_reused_outputs_untouched_on_error(target):
    sf = [_sf(), _sf(8, 4, 2)]
    outs = batched_transpose_weight_sf(sf, 32, [False, True], target=target)
    before = [t.clone() for pair in outs for t in pair]
    sf[0].copy_(_sf())
    sf[1][0, 7, 3] = 1.5
    with pytest.raises(ValueError, match=r"sf\[1\]"):
        batched_transpose_weight_sf(sf, 32, [False, True], outs, target=target)
    assert all(torch.equal(a, b) for a, b in zip(before, [t for pair in outs for t in pair], strict=True))


def test_wrong_flavor_for_target():
    with pytest.raises(ValueError, match="flavor"):
        batched_transpose_weight_sf([_sf()], 32, [False], target="ascend-sim", flavor="cuda")
