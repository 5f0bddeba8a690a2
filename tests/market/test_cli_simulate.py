"""``spotwise simulate`` end to end through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from spotwise.cli.main import app

runner = CliRunner()
SMALL = ["--compute-h", "4", "--deadline-h", "5", "--changeover-h", "0.2"]


def _run(*args: str):
    result = runner.invoke(app, ["simulate", *args])
    assert result.exit_code == 0, result.output
    return result


def test_json_output_has_the_documented_fields() -> None:
    out = json.loads(_run(*SMALL, "--policy", "uniform-progress", "--starts", "4", "--json").stdout)
    for key in ("policy", "mean_cost_usd", "mean_spot_hours", "mean_ondemand_hours", "misses"):
        assert key in out
    assert out["policy"] == "uniform-progress" and out["misses"] == 0
    assert len(out["runs"]) == 4
    for run in out["runs"]:
        for key in ("start_h", "cost_usd", "spot_hours", "ondemand_hours", "finish_h"):
            assert isinstance(run[key], float)
        assert run["deadline_met"] is True
        assert run["finish_h"] <= 5 + 1e-9
    starts = [r["start_h"] for r in out["runs"]]
    assert starts[0] == 0 and starts == sorted(starts) and len(set(starts)) == 4
    mean = sum(r["cost_usd"] for r in out["runs"]) / 4
    assert abs(out["mean_cost_usd"] - mean) < 1e-9


def test_compare_prints_a_table_relative_to_on_demand_and_optimum() -> None:
    out = _run(*SMALL, "--starts", "2", "--compare").stdout
    for name in ("on-demand", "greedy", "uniform-progress", "spotwise", "optimal"):
        assert name in out
    assert "vs optimal" in out and "vs on-demand" in out
    data = json.loads(_run(*SMALL, "--starts", "2", "--compare", "--json").stdout)
    rows = {p["policy"]: p for p in data["policies"]}
    assert abs(rows["on-demand"]["vs_ondemand"] - 1) < 1e-12
    assert abs(rows["optimal"]["vs_optimal"] - 1) < 1e-12
    # on-demand only: (C + d) x $3.06 on every run
    assert abs(rows["on-demand"]["mean_cost_usd"] - 4.2 * 3.06) < 1e-9
    assert all(p["vs_optimal"] >= 1 - 1e-12 for p in rows.values())


def test_csv_traces_several_zones_and_start_offset(tmp_path: Path) -> None:
    a, b = tmp_path / "zone-a.csv", tmp_path / "zone-b.csv"
    a.write_text("time_s,count\n" + "".join(f"{i * 600},{int(i % 7 < 3)}\n" for i in range(60)))
    b.write_text("time_s,count\n" + "".join(f"{i * 600},{int(i % 5 < 4)}\n" for i in range(60)))
    out = json.loads(
        _run(*SMALL, "--trace", str(a), "--trace", str(b), "--start-h", "1", "--json").stdout
    )
    assert out["runs"][0]["start_h"] == 1.0 and out["misses"] == 0


def test_timeline_pictures(tmp_path: Path) -> None:
    _run(*SMALL, "--policy", "greedy", "--starts", "2", "--timeline", str(tmp_path))
    pngs = sorted(tmp_path.glob("greedy-start-*.png"))
    assert len(pngs) == 2
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_bad_input_gives_a_clear_error_and_exit_2(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        code = "from spotwise.cli.main import main; main()"
        return subprocess.run(
            [sys.executable, "-c", code, "simulate", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = cli("--policy", "greedie")
    assert r.returncode == 2 and "unknown policy 'greedie'" in r.stderr
    assert "did you mean greedy" in r.stderr
    r = cli("--trace", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("--deadline-h", "2000")
    assert r.returncode == 2 and "needs" in r.stderr and "hint:" in r.stderr
