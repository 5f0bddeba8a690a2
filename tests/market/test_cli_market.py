"""The market commands, driven through the real Typer app (and one real subprocess)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotwise.cli.main import app
from spotwise.cli.market import parse_hours, sparkline
from spotwise.errors import ConfigError, MarketError, NoPlacementError, UnknownGPUError

PRICES = Path(__file__).resolve().parents[2] / "data" / "public" / "prices"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=True)


def test_advise_json_is_a_ranked_list_with_the_promised_fields():
    result = run("advise", "--gpu", "V100", "--count", "8", "--hours", "48", "--deadline", "60h",
                 "--json", "--no-history")  # fmt: skip
    assert result.exit_code == 0, result.output
    placements = json.loads(result.output)
    required = {"cloud", "region", "zone", "instance_type", "market", "gpus", "usd_per_hour",
                "expected_hours", "expected_cost_usd", "meets_deadline"}  # fmt: skip
    assert all(required <= set(p) for p in placements)
    assert all(p["gpus"] == 8 for p in placements)
    ok = [p for p in placements if p["meets_deadline"]]
    assert placements[: len(ok)] == ok  # deadline-feasible first
    assert [p["expected_cost_usd"] for p in ok] == sorted(p["expected_cost_usd"] for p in ok)
    assert any(not p["meets_deadline"] for p in placements)


def test_advise_table_names_the_best_placement():
    result = run("advise", "--gpu", "V100", "-n", "8", "--hours", "48h", "--no-history")
    assert result.exit_code == 0, result.output
    assert "best expected cost first" in result.output and "best: " in result.output


def test_advise_uses_newer_history_prices(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text(
        "cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
        "aws,us-east-1,use1-az5,p3.16xlarge,spot,0.5,2026-06-01T00:00:00Z\n"
    )
    db = tmp_path / "p.db"
    assert run("prices", "ingest", str(csv), "--db", str(db)).exit_code == 0
    result = run("advise", "--gpu", "V100", "-n", "8", "--hours", "48", "--json", "--db", str(db))
    best = json.loads(result.output)[0]
    assert (best["zone"], best["usd_per_hour"]) == ("use1-az5", 0.5)


def test_gpus_filters_and_json():
    result = run("gpus", "--gpu", "A100", "--count", "8", "--min-mem", "80", "--json")
    assert result.exit_code == 0
    types = json.loads(result.output)
    assert types and {t["gpu"] for t in types} == {"A100-80GB"}
    assert "p4de.24xlarge" in {t["instance_type"] for t in types}
    assert "p4d.24xlarge" in run("gpus", "--gpu", "A100", "--count", "8").output


@pytest.mark.parametrize(
    ("args", "error", "text"),
    [
        (["gpus", "--gpu", "V1000"], UnknownGPUError, "did you mean"),
        (["gpus", "--gpu", "V100", "--count", "64"], NoPlacementError, "most on one instance is 8"),
        (["advise", "--gpu", "V100", "--hours", "soon"], ConfigError, "cannot read --hours"),
        (["prices", "show"], MarketError, "no price history"),
        (["prices", "ingest"], ConfigError, "nothing to ingest"),
    ],
)
def test_bad_input_raises_our_errors(args, error, text):
    result = run(*args)
    assert isinstance(result.exception, error) and text in str(result.exception)


def test_errors_print_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "SPOTWISE_HOME": str(tmp_path), "SPOTWISE_PLATFORM": "none"}
    code = "from spotwise.cli.main import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "gpus", "--gpu", "H10"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown GPU 'H10'") and "H100" in proc.stderr


def test_prices_ingest_show_history_chart(tmp_path):
    src = tmp_path / "aws.csv"
    with (PRICES / "aws_p2_p3_spot_price_history.csv").open() as f:
        src.write_text("".join(itertools.islice(f, 1500)) + "garbage,row\n")
    db = str(tmp_path / "p.db")
    result = run("prices", "ingest", str(src), "--db", db)
    assert result.exit_code == 3, result.output  # a row was rejected; the good ones stored
    assert "1,499 rows read, 1,499 new or changed" in result.output
    assert "line 1501: expected 6 fields" in result.output
    again = run("prices", "ingest", str(src), "--db", db)
    assert "0 new or changed, 1,499 already stored" in again.output
    summary = json.loads(run("prices", "show", "--db", db, "--json").output)
    assert summary[0]["rows"] == 1499 and summary[0]["cloud"] == "aws"
    latest = json.loads(run("prices", "show", "--type", "p2.16xlarge", "--db", db, "--json").output)
    assert latest and all(r["instance_type"] == "p2.16xlarge" for r in latest)
    png = tmp_path / "chart.png"
    chart = run("prices", "history", "--type", "p2.16xlarge", "--db", db, "--png", str(png))
    assert chart.exit_code == 0, chart.output
    assert "aws/eu-west-1a" in chart.output and "min " in chart.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = run("prices", "history", "--type", "p9.huge", "--db", db)
    assert isinstance(empty.exception, MarketError)


def test_roi_prints_break_even():
    result = run("roi", "--gpu-hours", "40000", "--price", "250000", "--gpus", "8",
                 "--power-kw", "6.5", "--gpu", "A100", "--cloud", "aws", "--region", "us-east-1",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    names = [o["name"] for o in data["options"]]
    assert set(names) == {"buy", "on-demand", "reserved", "spot"}
    on_demand = next(o for o in data["options"] if o["name"] == "on-demand")
    assert 0 < on_demand["break_even_utilisation"] < 1
    text = run("roi", "--gpu-hours", "40000", "--price", "250000", "--power-kw", "6.5",
               "--on-demand-usd", "2.5").output  # fmt: skip
    assert "break-even utilisation against on-demand" in text


def test_parse_hours_and_sparkline():
    assert parse_hours("60h", "x") == 60 and parse_hours("90m", "x") == 1.5
    assert parse_hours("2d", "x") == 48 and parse_hours("1.5", "x") == 1.5
    with pytest.raises(ConfigError):
        parse_hours("-3h", "x")
    # a step function on a shared time axis: the price holds until the next change
    points = [(10, 1.0), (40, 3.0), (50, 2.0)]
    assert sparkline(points, 0, 60, 1.0, 3.0, width=6) == "▁▁▁█▅▅"
    assert sparkline(points, 0, 60, 1.0, 3.0, width=12)[0] == " "  # before the first point
    assert len(sparkline([(0, 1.0)], 0, 100, 0.0, 2.0, width=40)) == 40


SPOTWISE_HEADER = "cloud,region,zone,instance_type,market,usd_per_hour,timestamp"


def test_ingest_exit_status_says_whether_rows_were_rejected(tmp_path):
    env = {**os.environ, "SPOTWISE_HOME": str(tmp_path), "SPOTWISE_PLATFORM": "none"}
    db = str(tmp_path / "p.db")
    clean, mixed = tmp_path / "clean.csv", tmp_path / "mixed.csv"
    clean.write_text(f"{SPOTWISE_HEADER}\naws,us-east-1,,p3.2xlarge,on-demand,3.06,2026-01-01\n")
    # a Latin-1 file (Excel's "CSV" on Windows) with one row whose instance type is empty
    mixed.write_bytes(
        f"{SPOTWISE_HEADER}\r\n"
        "azure,brazilsouth,,Standard_NC6s_v3,spot,0.9,2026-01-01\r\n"
        "azure,brazilsouth,,,spot,0.8,2026-01-01\r\n"
        "azure,São Paulo,,Standard_NC6s_v3,on-demand,3.1,2026-01-01\r\n".encode("latin-1")
    )
    code = "from spotwise.cli.main import main; main()"
    ok = subprocess.run([sys.executable, "-c", code, "prices", "ingest", str(clean), "--db", db],
                        capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-c", code, "prices", "ingest", str(mixed), "--db", db],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr
    assert "mixed.csv is not valid UTF-8; reading it as Latin-1" in bad.stderr
    assert "line 3: empty instance_type" in bad.stdout
    assert "1 row(s) rejected; the other rows were stored (exit status 3)" in bad.stderr
    rows = json.loads(run("prices", "show", "--db", db, "--json").output)
    assert sum(r["rows"] for r in rows) == 3  # the clean row and the two good Latin-1 rows
    latest = json.loads(run("prices", "show", "--type", "Standard_NC6s_v3", "--db", db,
                            "--json").output)  # fmt: skip
    assert {r["region"] for r in latest} == {"brazilsouth", "São Paulo"}


def test_ingest_source_names_come_from_the_registry(tmp_path, retail_api):
    db = str(tmp_path / "p.db")
    clean = tmp_path / "clean.csv"
    clean.write_text(f"{SPOTWISE_HEADER}\naws,us-east-1,,p3.2xlarge,on-demand,3.06,2026-01-01\n")
    read = run("prices", "ingest", "--source", "csv", str(clean), "--source", "azure",
               "--type", "Standard_NC24s_v3", "--db", db)  # fmt: skip
    assert read.exit_code == 3, read.output  # the recorded pages hold two bad rows
    assert "csv:clean.csv: 1 rows read" in read.output
    assert "azure:retail-prices: 5 rows read" in read.output
    assert "p.db: 6 rows in total" in read.output
    unknown = run("prices", "ingest", "--source", "azur", "--db", db)
    assert "unknown price source 'azur'" in str(unknown.exception)
    assert "did you mean azure" in str(unknown.exception)
    unread = run("prices", "ingest", "--source", "azure", str(clean), "--db", db)
    assert "no --source named reads files" in str(unread.exception)
    no_files = run("prices", "ingest", "--source", "aws-json", "--db", db)
    assert "--source aws-json FILE" in str(no_files.exception)
