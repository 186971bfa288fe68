"""The cuda target of every op: each family's record (vmi_core.cuda_record) names real ops and
`vmi list` shows it; every kernel's generated source keeps the shared-memory rules a GPU enforces."""

from __future__ import annotations

import re

import pytest

from vmi_core import cuda_record
from vmi_core.compile import CUDA_SHARED_LIMIT, kernel_requests
from vmi_core.tools.registry import discover
from vmi_core.tools.source_checks import cuda_dynamic_shared_bytes, cuda_shared_memory_problems

OPS = sorted({op.name for op in discover().values()})


def test_every_family_ships_a_record_of_its_own_ops() -> None:
    ops = {op.name: op for op in discover().values()}
    for family in {op.family for op in ops.values()}:
        record = cuda_record.family_record(f"vmi_{family}")
        assert set(record) >= {"runs", "ops", "kernels"}, family
        names = {name for name, op in ops.items() if op.family == family}
        assert set(record["ops"]) <= names, family
        for outcome in record["ops"].values():
            assert outcome["run"] in record["runs"]
        for entry in record["kernels"].values():
            assert set(entry["ops"]) <= names and entry["run"] in record["runs"]
            assert entry["result"] in ("pass", "fail", "error")


def test_the_cuda_support_line_is_the_records() -> None:
    ops = discover()
    assert "6 of 33 cases correct" in ops["per_token_cast"].targets["cuda"]
    assert "never run on a GPU, so launches are refused" in ops["mhc_post_fwd"].targets["cuda"]
    for op in ops.values():
        assert op.targets["cuda"] == cuda_record.op_status(f"vmi_{op.family}", op.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPS)
def test_every_kernel_keeps_the_shared_memory_rules(name: str) -> None:
    """At the default options: TMA tiles aligned in dynamic shared memory, no static shared memory
    over 48 KB, no block over the 227 KB a block may have (the lowering tests check the options they
    cover the same way)."""
    op = discover()[name]
    defaults = {o.name: o.default for o in op.options}
    source = op.source(defaults, "cuda", None)
    kernels = re.split(r"^// vmi source: ", source, flags=re.MULTILINE)[1:]
    assert kernels
    for kernel in kernels:
        assert cuda_shared_memory_problems(kernel) == [], kernel.splitlines()[0]
    with kernel_requests() as requests:
        op.source(defaults, "cuda", None)
    for build, spec, _, config in requests:
        assert cuda_dynamic_shared_bytes(build(spec, "cuda"), **config) <= CUDA_SHARED_LIMIT, (build.__name__, spec)
