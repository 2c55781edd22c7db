"""docs/performance.md's results table is what bench/results/ generates, and a benchmark run writes those files."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from bench.common import ResultsFiles, Target, report_targets
from bench.report import PAGE, load_results, render_table, with_table


def test_the_results_table_is_the_one_the_results_files_generate() -> None:
    page = PAGE.read_text()
    assert with_table(page, render_table(load_results())) == page, "stale results table: run python -m bench.report"


def test_a_run_writes_one_file_per_target_and_the_table_shows_its_figure(tmp_path: Path) -> None:
    results = ResultsFiles("placement", "python -m bench.placement --databases 1000", tmp_path)
    report_targets(
        [
            Target(
                "placement in-process 200 vs 20 shards 1.27x",
                "<= 1.2x",
                False,
                key="in-process",
                what="placing one database in-process, 200 over 20 shards",
                value=1.2712,
                unit="x",
            ),
            Target("a line printed only", "<= 1", True),
        ],
        results,
    )

    assert [p.name for p in tmp_path.iterdir()] == ["placement.in-process.json"]
    record = json.loads((tmp_path / "placement.in-process.json").read_text())
    assert record["figure"] == 1.27
    assert record["pass"] is False
    assert record["goal"] == "<= 1.2x"
    assert record["command"] == "python -m bench.placement --databases 1000"
    assert record["date"] == dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", record["commit"])
    assert f"| 1.27x | **FAIL** | {record['date']} | `{record['commit']}` |" in render_table(load_results(tmp_path))
