"""Copy a few real spot availability traces into the package (src/spotwise/data/traces/).

The sim provider and the README demo replay them; tests and benchmarks read the full set from
data/public/traces instead. Files are copied unchanged (after a format check), so provenance
is simply the upstream file: see src/spotwise/data/traces/README.md.

    .venv/bin/python scripts/ship_traces.py [--shared data/public]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from spotwise.market.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / "src" / "spotwise" / "data" / "traces"
# group -> files under data/public/traces/availability/1-node/<group>/
SELECTION = {
    "aws-10-26-2022": ["us-west-2a_v100_1.json", "us-west-2b_v100_1.json"],
    "aws-02-15-2023-first30d": [
        "us-east-1a_v100_1.json",
        "us-east-1c_v100_1.json",
        "us-east-1d_v100_1.json",
        "us-east-1f_v100_1.json",
        "us-east-2a_v100_1.json",
        "us-east-2b_v100_1.json",
        "us-west-2a_v100_1.json",
        "us-west-2b_v100_1.json",
        "us-west-2c_v100_1.json",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / "data" / "public")
    args = parser.parse_args()
    src_root = args.shared / "traces" / "availability" / "1-node"
    for group, files in SELECTION.items():
        (DEST / group).mkdir(parents=True, exist_ok=True)
        for name in files:
            src = src_root / group / name
            trace = load_trace(src)  # refuse to ship a file we could not read back
            shutil.copyfile(src, DEST / group / name)
            print(
                f"{group}/{name}: {trace.n_ticks} ticks of {trace.gap_s:g} s, "
                f"spot available {trace.availability():.0%}"
            )


if __name__ == "__main__":
    main()
