"""benchmarks/bench_region_calls.py runs and reports what it says it does (aot_eager: the same regions
and calls without inductor's kernel build; its figures mean nothing here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_region_calls  # noqa: E402


def test_each_region_size_gets_its_calls_and_ratios_to_the_default(tmp_path):
    result = bench_region_calls.main(["--layers", "2", "--regions", "1", "whole", "--backend", "aot_eager",
                                      "--steps", "2", "--repeats", "1", "--output", str(tmp_path / "out.json")])
    rows = {row["regions"]: row for row in result["results"]}
    assert {name: row["region_calls"] for name, row in rows.items()} == {"1": 8, "whole": 2}
    assert rows["1"]["ratio_to_default"] == 1.0 and rows["whole"]["us_per_extra_call"] is None
    assert all(row["ms_per_micro_batch"] > 0 for row in rows.values())
    assert (tmp_path / "out.json").is_file()
    assert bench_region_calls.region_calls("4", 12) == 2 * (2 + 3) == bench_region_calls.region_calls("5", 12)
    with pytest.raises(ValueError):
        bench_region_calls.region_calls("none", 12)
