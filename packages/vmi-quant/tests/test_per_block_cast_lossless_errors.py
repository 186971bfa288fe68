"""per_block_cast_lossless: bad input raises a clear TypeError/ValueError naming the argument,
before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import reference
from vmi_quant.ops.per_block_cast_lossless import per_block_cast_lossless

no_kernel = no_kernel_fixture("vmi_quant.kernels.per_block_cast_lossless")


QX = reference.cast(torch.ones(128, 256), "e2m1", (1, 32), round_sf=True)
DATA, SF = QX
XB, OB = (1, 32), (32, 32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: per_block_cast_lossless(QX, "e2m1", XB, OB), ValueError, "fmt must be 'e4m3'"),
    (lambda: per_block_cast_lossless(QX, None, XB, OB), TypeError, "fmt must be a str"),
    (lambda: per_block_cast_lossless(torch.ones(128, 256), "e4m3", XB, OB), TypeError, "x must be a quantized"),
    (lambda: per_block_cast_lossless((DATA, SF, SF), "e4m3", XB, OB), ValueError, "x must be a quantized"),
    (lambda: per_block_cast_lossless((DATA.view(torch.uint8), SF), "e4m3", XB, OB), TypeError, "x data must be int8"),
    (lambda: per_block_cast_lossless((DATA, SF.tolist()), "e4m3", XB, OB), TypeError, "x sf must be a torch.Tensor"),
    (lambda: per_block_cast_lossless((DATA, SF.to(torch.float8_e4m3fn)), "e4m3", XB, OB), TypeError,
     "powers of two"),
    (lambda: per_block_cast_lossless((DATA, SF.double()), "e4m3", XB, OB), TypeError, "x sf must be float32"),
    (lambda: per_block_cast_lossless((DATA, SF[:, :4]), "e4m3", XB, OB), ValueError, "x sf must have shape"),
    (lambda: per_block_cast_lossless((DATA[:64], SF[:64]), "e4m3", XB, OB), ValueError, "multiples of 128"),
    (lambda: per_block_cast_lossless((DATA[:, :32], SF[:, :2]), "e4m3", XB, OB), ValueError, "multiples of 128"),
    (lambda: per_block_cast_lossless((DATA.t(), SF), "e4m3", XB, OB), ValueError, "unit stride"),
    (lambda: per_block_cast_lossless(QX, "e4m3", (1, 24), OB), ValueError, "x_block_size must be a tuple"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, (32, 256)), ValueError, "out_block_size must be a tuple"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, [32, 32]), ValueError, "out_block_size must be a tuple"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, (32, 16)), ValueError, "must be a multiple of x_block_size"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, OB, use_packed_ue8m0=True), ValueError,
     "use_packed_ue8m0 requires round_sf"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, OB, round_sf=1), TypeError, "round_sf"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, OB, use_tma_aligned_col_major_sf="no"), TypeError,
     "use_tma_aligned_col_major_sf"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, OB, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: per_block_cast_lossless(QX, "e4m3", XB, OB, flavor="rocm"), ValueError, "flavor must be one of"),
    # Packed words must be the flavor's: int16 pairs are not the cuda flavor's int32 quads.
    (lambda: per_block_cast_lossless(reference.cast(torch.ones(128, 256), "e2m1", XB, round_sf=True,
                                                    use_packed_ue8m0=True), "e4m3", XB, OB, flavor="cuda"),
     TypeError, "packed UE8M0 torch.int32"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_packed_along_tokens_cannot_be_column_major():
    qx = reference.cast(torch.ones(128, 256), "e2m1", (32, 1), round_sf=True)
    with pytest.raises(ValueError, match="cannot be column-major"):
        per_block_cast_lossless(qx, "e4m3", (32, 1), (32, 1), use_tma_aligned_col_major_sf=True, round_sf=True,
                                use_packed_ue8m0=True)


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
@pytest.mark.parametrize("byte", [0, 255])
def test_packed_sf_bytes_outside_1_to_254_are_refused(byte, flavor):
    """Byte 0 (2^-127) and 255 (NaN) in a used byte of a packed input SF, like an fp32 SF that is not
    a normal power of two, raise before any kernel (and in the reference); a pad byte is not read."""
    block = (1, 128)
    data, sf = reference.cast(torch.ones(128, 384), "e2m1", block, round_sf=True, use_packed_ue8m0=True,
                              flavor=flavor)
    raw = sf.view(torch.uint8)  # 3 SF per row: the last word of each row has a pad byte
    assert 3 % (raw.shape[1] // sf.shape[1])
    padded = raw.clone()
    padded[:, -1] = byte
    bad = raw.clone()
    bad[5, 1] = byte
    per_block_cast_lossless((data, padded.view(sf.dtype)), "e4m3", block, block, round_sf=True,
                            use_packed_ue8m0=True, flavor=flavor, target="torch")
    for run in (per_block_cast_lossless, reference.per_block_cast_lossless):
        with pytest.raises(ValueError, match=f"packed UE8M0.*block \\[5, 1\\] is byte {byte}"):
            run((data, bad.view(sf.dtype)), "e4m3", block, block, round_sf=True, use_packed_ue8m0=True,
                flavor=flavor)
