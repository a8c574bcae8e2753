"""doctor on a machine without a GPU (this one): what the ci profile runs, not a column of failures.

It used to mark every section ✘ and then run-lab.sh ran them all (on the ci profile). The report is made from
this machine's real node description (NVML absent), so the test runs wherever the suite runs without a GPU.
"""

from __future__ import annotations

import pytest

from lab_helpers.present.doctor import CI_ONLY, NOT_OK, check_node, format_report


def test_a_cpu_machine_is_told_what_the_ci_profile_runs():
    node = check_node()
    if node.get("gpus"):
        pytest.skip("this machine has a GPU: the ci verdict is for machines without one")
    report = format_report(node)
    sections = report.split("Lab sections on this node", 1)[1]
    assert f"{CI_ONLY} single " in sections and f"{CI_ONLY} multi " in sections
    assert f"{NOT_OK} single " not in sections  # the section runs here, small: not a failure
    verdict = next(line for line in report.splitlines() if line.startswith("Verdict:"))
    assert "ci profile" in verdict and "never GPU figures" in verdict and "qlora recorded skipped" in verdict
