"""The shipped catalog: loads offline, resolves GPU names, explains impossible requests."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from spotwise.errors import NoPlacementError, UnknownGPUError
from spotwise.market.catalog import Catalog, canonical_gpu, gcp_vm_gpus, load_catalog, read_offers

SHARED = Path(__file__).resolve().parents[2] / "data" / "public"


def test_shipped_catalog_covers_four_clouds_and_both_markets():
    catalog = load_catalog()
    clouds = {(o.cloud, o.market) for o in catalog.offers}
    assert {("aws", "spot"), ("aws", "on-demand"), ("gcp", "spot"), ("azure", "spot")} <= clouds
    assert ("lambda", "on-demand") in clouds and ("lambda", "spot") not in clouds
    assert {"V100", "A100", "A100-80GB", "H100", "T4", "L4"} <= set(catalog.gpus())


def test_p3_16xlarge_facts_match_the_public_source():
    catalog = load_catalog()
    [p3] = [
        t
        for t in catalog.find(gpu="V100", count=8, cloud="aws")
        if t.instance_type == "p3.16xlarge"
    ]
    assert (p3.gpus, p3.gpu_mem_gb, p3.vcpus, p3.ram_gb) == (8, 16, 64, 488)
    # us-east-1 on-demand list price of p3.16xlarge in the 2026 Vantage table
    assert catalog.price("aws", "us-east-1", "p3.16xlarge", "on-demand") == pytest.approx(24.48)


def test_shipped_on_demand_prices_equal_the_source_rows():
    src = SHARED / "catalog" / "aws_gpu_instances_ondemand_2026-01-21_vantage_via_tsaol.csv"
    catalog = load_catalog()
    with src.open() as f:
        rows = [r for r in csv.DictReader(f) if float(r["gpu_count"]) >= 1]
    for row in rows[::50]:
        assert catalog.price("aws", row["region"], row["instance_type"], "on-demand") == (
            pytest.approx(float(row["ondemand_usd_hr"]))
        )


def test_gcp_vm_price_includes_its_gpus():
    # a2-highgpu-1g in us-central1 (2026-04-28 snapshot): host 0.73948 + A100 x1 2.93391
    price = load_catalog().price("gcp", "us-central1", "a2-highgpu-1g", "on-demand")
    assert price == pytest.approx(0.73948 + 2.93391, rel=1e-5)


def test_find_filters_by_count_and_memory():
    found = load_catalog().find(gpu="a100", count=8, min_mem_gb=80)
    assert found and all(t.gpu == "A100-80GB" and t.gpus == 8 for t in found)
    assert "p4de.24xlarge" in {t.instance_type for t in found}


@pytest.mark.parametrize(
    ("raw", "mem", "want"),
    [("NVIDIA V100", 16, "V100"), ("NVIDIA V100", 32, "V100-32GB"), ("NVIDIA A100", 80,
     "A100-80GB"), ("nvidia-tesla-t4", None, "T4"), ("NVIDIA B200 Blackwell", 179, "B200")],
)  # fmt: skip
def test_canonical_gpu_names(raw, mem, want):
    assert canonical_gpu(raw, mem) == want


def test_gcp_machine_types_know_their_gpus():
    assert gcp_vm_gpus("a2-ultragpu-8g") == ("A100-80GB", 8)
    assert gcp_vm_gpus("g2-standard-48") == ("L4", 4)
    assert gcp_vm_gpus("n2-standard-8") is None


def test_unknown_gpu_suggests_close_matches():
    with pytest.raises(UnknownGPUError) as err:
        load_catalog().find(gpu="V1000")
    assert "V100" in str(err.value) and "did you mean" in str(err.value)


def test_more_gpus_than_any_type_has_is_explained():
    with pytest.raises(NoPlacementError, match="the most on one instance is 8"):
        load_catalog().find(gpu="V100", count=64)


def test_missing_price_raises_with_hint():
    with pytest.raises(NoPlacementError, match="no spot price"):
        load_catalog().price("lambda", "us-east-1", "gpu_8x_v100", "spot")


def test_with_prices_overrides_and_adds_places():
    catalog = load_catalog()
    updated = catalog.with_prices(
        [("aws", "us-east-1", "use1-az9", "p3.2xlarge", "spot", 0.5, "2026-01-01")]
    )
    assert updated.price("aws", "us-east-1", "p3.2xlarge", "spot", zone="use1-az9") == 0.5
    assert len(updated) == len(catalog) + 1


def test_catalog_from_text_rejects_wrong_columns():
    with pytest.raises(Exception, match="columns"):
        read_offers("a,b\n1,2\n")
    assert len(Catalog(read_offers(io.StringIO(_header()).getvalue()))) == 0


def _header() -> str:
    from spotwise.market.catalog import _FIELDS

    return ",".join(_FIELDS) + "\n"


def test_market_is_pure_and_light():
    """No torch, no cloud SDK, no providers get imported by the market or its commands."""
    import subprocess
    import sys

    code = (
        "import sys, spotwise.market, spotwise.market.prices, spotwise.market.roi, "
        "spotwise.market.sources.csvfile, spotwise.market.sources.azure, spotwise.cli.market\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'boto3', 'botocore', "
        "'matplotlib') or m.startswith('spotwise.control')]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_shipped_data_is_what_the_build_script_makes(tmp_path):
    """The committed catalog files are exactly the build script's output from data/public."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "build_catalog.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    shipped = root / "src" / "spotwise" / "data" / "catalog"
    for name in ("offers.csv", "interruption.csv", "reserved.csv", "sources.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
