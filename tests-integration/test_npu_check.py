"""scripts/npu-check end to end on ascend-sim (the same stages an NPU host runs, on narrow selections),
its verdicts, and the calibration column of vmi-core's assumption table."""

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from vmi_devkit import npu_check
from vmi_devkit.calibration import CALIBRATIONS, Calibration, calibrate

ROOT = Path(__file__).resolve().parents[1]


def _npu_check(out: Path, *selection: str) -> dict:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "npu-check"), "--target", "ascend-sim", "--out", str(out),
                           *selection], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def _assert_stages_pass(report: dict, calibrations: list[str], family: str, op: str) -> None:
    assert [r["name"] for r in report["calibrations"]] == calibrations
    assert all(r["error"] is None and not r["disagreements"] and r["checked"] for r in report["calibrations"])
    counts = report["tests"]["families"][family]
    assert counts["passed"] >= 1 and counts["failed"] == counts["errors"] == 0
    cases = report["bench"]["report"]["ops"][op]["cases"]
    assert cases and all(c["status"] == "pass" for c in cases)


def test_npu_check_runs_every_stage_on_ascend_sim(tmp_path):
    """One calibration, one family test, one op's check and bench: each stage runs and reports."""
    report = _npu_check(tmp_path, "--calibrations", "dma", "--families", "moe", "--tests-k",
                        "test_normalize_weight and test_matches_reference", "--quick", "--ops", "normalize_weight",
                        "--repeat", "1", "--jobs", "1")
    _assert_stages_pass(report, ["dma"], "moe", "normalize_weight")
    assert report["environment"]["target"] == "ascend-sim" and report["counterparts"] == []
    text = (tmp_path / "report.md").read_text()
    assert "- result: pass" in text and "| dma | DMA UB rounding bytes; DMA strides | 1 | agrees |" in text


@pytest.mark.slow
def test_npu_check_every_calibration_and_a_family_on_ascend_sim(tmp_path):
    report = _npu_check(tmp_path, "--families", "moe", "--quick", "--ops", "normalize_weight,topk_gate",
                        "--repeat", "2")
    _assert_stages_pass(report, list(CALIBRATIONS), "moe", "topk_gate")


def test_a_disagreement_and_a_kernel_that_does_not_run_fail_the_report(monkeypatch):
    def run(target):
        return {"same": (np.arange(4), np.arange(4)), "off": (np.array([1, 2, 7, 4]), np.arange(1, 5))}

    def broken(target):
        raise RuntimeError("bisheng: error: no matching function\nfor call to asc_x")

    monkeypatch.setitem(CALIBRATIONS, "probe", Calibration("probe", ("reductions",), run))
    monkeypatch.setitem(CALIBRATIONS, "broken", Calibration("broken", ("reductions",), broken))
    result = calibrate("probe", "ascend-sim")
    assert result.checked == ["same", "off"] and not result.agrees
    assert result.disagreements == {"off": "1 of 4 elements differ; first at (2,): actual 7 (0x0000000000000007), "
                                           "expected 3 (0x0000000000000003)"}
    failed = calibrate("broken", "ascend-sim")
    assert not failed.agrees
    assert failed.error == "RuntimeError: bisheng: error: no matching function ... for call to asc_x"
    report = {"environment": {"target": "ascend"}, "elapsed_s": 1.0,
              "calibrations": [asdict(result), asdict(failed)]}
    assert npu_check.failed(report)
    text = npu_check.markdown(report)
    assert "- result: FAIL" in text and "`off`: 1 of 4 elements differ" in text and "did not run: RuntimeError" in text


def _assumption_rows() -> dict[str, str]:
    """topic -> the calibration cell of the assumption table in vmi-core's README."""
    text = (ROOT / "packages" / "vmi-core" / "README.md").read_text()
    table = text[text.index("| topic | the model | evidence | calibration |"):].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {cells[0].removeprefix("| "): cells[3] for cells in rows}


def test_the_assumption_table_names_each_rows_calibration():
    rows = _assumption_rows()
    for name, cal in CALIBRATIONS.items():
        assert set(cal.rows) <= set(rows), f"{name} settles rows the table does not have"
    for topic, cell in rows.items():
        expected = [name for name, cal in CALIBRATIONS.items() if topic in cal.rows]
        assert re.findall(r"`([\w-]+)`", cell) == expected, topic
