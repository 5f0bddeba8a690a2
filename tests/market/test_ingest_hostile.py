"""`prices ingest` and `prices show` with files nobody on the project wrote (real CLI processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from spotwise.cli.main import app

runner = CliRunner()
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
HEADER = "cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
GOOD = "aws,us-east-1,use1-az5,p3.2xlarge,spot,0.9,2026-06-01T00:00:00Z\n"


def _show(*args: str) -> str:
    """`prices show` in this process (exit 0 expected)."""
    result = runner.invoke(app, ["prices", "show", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out


def test_a_128_kib_cell_is_one_rejected_row(tmp_path: Path):
    csv = tmp_path / "p.csv"
    huge = "z" * (128 * 1024 + 1)
    csv.write_text(HEADER + GOOD + f"aws,us-east-1,{huge},p3.2xlarge,spot,1,2026-06-01T01:00:00Z\n")
    db = tmp_path / "p.db"
    out = _cli("prices", "ingest", str(csv), "--db", str(db))
    assert out.returncode == 3, out.stderr
    assert "line 3:" in out.stdout and "1 rejected" in out.stdout
    assert len(out.stdout) + len(out.stderr) < 2000
    shown = json.loads(_show("--type", "p3.2xlarge", "--db", str(db), "--json"))
    assert [r["usd_per_hour"] for r in shown] == [0.9]  # the good row was stored


def test_control_characters_from_the_file_are_escaped(tmp_path: Path):
    unknown = tmp_path / "weird.csv"
    unknown.write_text("\x1b]0;owned\x07\x1b[2J,b\nx,y\n")
    out = _cli("prices", "ingest", str(unknown), "--db", str(tmp_path / "p.db"))
    assert out.returncode == 2 and "unknown CSV format" in out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
    assert "\\x1b[2J" in out.stderr

    rows = tmp_path / "rows.csv"
    rows.write_text(
        HEADER + GOOD + "aws,us-east-1,z,p3.2xlarge,\x1b[31mspot,1,2026-06-01T00:00:00Z\n"
    )
    out = _cli("prices", "ingest", str(rows), "--db", str(tmp_path / "p.db"))
    assert out.returncode == 3
    assert "\x1b" not in out.stdout + out.stderr and "\\x1b[31mspot" in out.stdout


def test_aws_cli_json_is_ingested(tmp_path: Path):
    """What `aws ec2 describe-spot-price-history --output json` prints (CLI v2 timestamps)."""
    history = {
        "SpotPriceHistory": [
            {
                "AvailabilityZone": "us-east-1a",
                "InstanceType": "p3.2xlarge",
                "ProductDescription": "Linux/UNIX",
                "SpotPrice": "0.918000",
                "Timestamp": "2026-05-01T12:00:00+00:00",
            },
            {
                "AvailabilityZone": "us-west-2-lax-1a",
                "InstanceType": "p3.2xlarge",
                "ProductDescription": "Linux/UNIX (Amazon VPC)",
                "SpotPrice": "1.100000",
                "Timestamp": "2026-05-01T13:00:00.000Z",
            },
            {
                "AvailabilityZone": "us-east-1b",
                "InstanceType": "p3.2xlarge",
                "ProductDescription": "Windows",
                "SpotPrice": "3.0",
                "Timestamp": "2026-05-01T12:00:00+00:00",
            },
            {"AvailabilityZone": "us-east-1c", "InstanceType": "p3.2xlarge"},
        ],
        "NextToken": "",
    }
    path = tmp_path / "history.json"
    path.write_text(json.dumps(history, indent=4))
    db = tmp_path / "p.db"
    out = _cli("prices", "ingest", str(path), "--db", str(db))
    assert out.returncode == 3, out.stderr  # the fourth item has no price
    assert "item 4: no ProductDescription, SpotPrice, Timestamp" in out.stdout
    shown = json.loads(_show("--type", "p3.2xlarge", "--db", str(db), "--json"))
    assert {(r["region"], r["zone"], r["usd_per_hour"]) for r in shown} == {
        ("us-east-1", "us-east-1a", 0.918),
        ("us-west-2", "us-west-2-lax-1a", 1.1),
    }
    path.write_text(json.dumps(history["SpotPriceHistory"][:1]))  # --query SpotPriceHistory
    assert _cli("prices", "ingest", str(path), "--db", str(db)).returncode == 0


def test_prices_show_prints_markup_in_data_as_written(tmp_path: Path):
    csv = tmp_path / "p.csv"
    csv.write_text(
        HEADER + "aws,us-east-1,[/]zone[bold],p3.2xlarge,spot,0.9,2026-06-01T00:00:00Z\n"
    )
    db = tmp_path / "p.db"
    assert _cli("prices", "ingest", str(csv), "--db", str(db)).returncode == 0
    assert "[/]zone[bold]" in _show("--type", "p3.2xlarge", "--db", str(db))
