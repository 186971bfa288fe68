"""scripts/ascend-api-check's reading of clang's output and of a ``vmi source`` listing (the compile
against asc-devkit needs clang and a checkout of the headers, so it is run by hand: its results
are in the closing notes)."""

from __future__ import annotations

from pathlib import Path

from vmi_devkit.ascend_api_check import attribute, diagnostics, kernels_of

KERNEL = Path("/work/ops/moe_topk_gate/kernel0.cpp")
TEMPLATE = "/site/tilelang/src/tl_templates/ascend/simd_inst.h"
VENDOR = "/headers/impl/c_api/instr_impl/npu_arch_3510/vector_compute_impl.h"

STDERR = f"""\
{KERNEL}:1777:20: error: call to 'max' is ambiguous
/headers/include/simt_api/math_functions.h:259:27: note: candidate function
{TEMPLATE}:343:31: error: no matching function for call to 'asc_shiftright'
{KERNEL}:71:17: note: in instantiation of function template specialization 'simd_inst::vshr' requested here
{TEMPLATE}:790:5: error: use of undeclared identifier 'asc_pack_to_high'
{VENDOR}:12:3: error: use of undeclared identifier 'vshr'
{VENDOR}:20:3: warning: unused variable 'x'
2 errors generated.
"""


def test_errors_are_attributed_to_the_kernel_its_templates_or_the_vendor():
    found = attribute(STDERR, KERNEL)
    assert [group[0].split(": error: ")[1] for group in found["kernel"]] == [
        "call to 'max' is ambiguous", "no matching function for call to 'asc_shiftright'"]
    assert [group[0].split(": error: ")[1] for group in found["template"]] == [
        "use of undeclared identifier 'asc_pack_to_high'"]
    assert [group[0].split(": error: ")[1] for group in found["vendor"]] == ["use of undeclared identifier 'vshr'"]


def test_a_diagnostic_keeps_its_notes():
    groups = diagnostics(STDERR)
    assert [len(group) for group in groups] == [2, 2, 1, 1, 1]
    assert groups[1][1].endswith("requested here")


def test_a_listing_splits_into_its_kernels():
    listing = ("// vmi source: op, kernel 1 of 2: a; target ascend\n// specialisation: A()\nint a;\n"
               "// vmi source: op, kernel 2 of 2: b; target ascend\n// specialisation: B()\nint b;\n")
    assert kernels_of(listing) == [
        "// vmi source: op, kernel 1 of 2: a; target ascend\n// specialisation: A()\nint a;\n",
        "// vmi source: op, kernel 2 of 2: b; target ascend\n// specialisation: B()\nint b;\n"]
    assert kernels_of("no kernel here") == []
