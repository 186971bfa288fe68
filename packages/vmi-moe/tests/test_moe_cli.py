"""The ``vmi`` command covers the four MoE ops: list, run (both flavors; one op on ascend-sim), bench
and source.

The ops' checks are also shown to fail on outputs that are off by one ulp or one index,
so a ``matches the reference`` line means something.
"""

import pytest
import torch

from vmi_core.tools.cli import main
from vmi_core.tools.registry import discover

OPS = ("topk_gate", "normalize_weight", "moe_topk_gate", "moe_topk_gate_backward")
SMALL = {"normalize_weight": "300x8"}


def test_list_names_the_four_ops(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in OPS:
        assert f"{name} " in out and "[moe]" in out
    assert discover()["moe_topk_gate_forward"].name == "moe_topk_gate"


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
@pytest.mark.parametrize("op", OPS)
def test_run_matches_reference(capsys, op: str, flavor: str):
    assert main(["run", op, "--shape", SMALL.get(op, "300x72"), "--flavor", flavor, "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "matches the reference" in out and "bit-exact torch reference" in out


def test_run_on_ascend_sim(capsys):
    """``vmi run --target ascend-sim``: topk_gate's emitted AscendC on the simulated vector core."""
    assert main(["run", "topk_gate", "--shape", "300x72", "-o", "num_topk=6", "--target", "ascend-sim",
                 "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "target=ascend-sim" in out and "matches the reference" in out


def test_run_with_options(capsys):
    assert main(["run", "moe_topk_gate", "--shape", "200x36", "-o", "num_topk=6", "-o", "num_shared_experts=2",
                 "--min-time", "0.01"]) == 0
    assert main(["run", "moe_topk_gate_backward", "--shape", "120x64", "-o", "num_sequences=3",
                 "--min-time", "0.01"]) == 0
    assert capsys.readouterr().out.count("matches the reference") == 2


def test_bench_prints_ratios(capsys):
    assert main(["bench", "topk_gate", "--shape", "256x72", "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "256x72" in out and "MISMATCH" not in out


# Lowering for Ascend is the lowering tests' subject: one op here, the others in the slow run.
@pytest.mark.parametrize("op", [op if i == 0 else pytest.param(op, marks=pytest.mark.slow) for i, op in enumerate(OPS)])
def test_source_for_ascend(capsys, op: str):
    assert main(["source", op, "--target", "ascend"]) == 0
    # A vector region: SIMT (launched with asc_vf_call) or SIMD (explicit vector instructions).
    out = capsys.readouterr().out
    assert "asc_vf_call" in out or "simd_inst::" in out


@pytest.mark.parametrize("op", OPS)
def test_checks_catch_a_perturbed_output(op: str):
    info = discover()[op]
    options = info.parse_options([])
    inputs = info.make_inputs((64, 72), options, 1)
    expected = info.reference(inputs, options, "ascend")
    assert info.check(expected, expected) == []
    first, *rest = expected
    if first.dtype == torch.int64:
        broken = first.clone()
        broken[0, 0] = (broken[0, 0] + 1) % 72
    else:
        # The largest element moved by far more than any tolerance: ten thousand ulps.
        broken = first.clone()
        flat = broken.view(-1).view(torch.int32)
        flat[int(first.abs().argmax())] += 10000
    assert info.check((broken, *rest), expected)
