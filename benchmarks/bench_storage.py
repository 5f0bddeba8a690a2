"""Checkpoint storage throughput: spotwise's S3 backend against boto3's own transfer manager.

Starts a moto S3 server in its own process on 127.0.0.1, writes one checkpoint-sized file, then
times, in the same run and against the same server:

* boto3 ``upload_file`` / ``download_file`` (s3transfer) with the same part size and concurrency,
* ``S3Storage.put`` / ``get`` of a file (which also records and verifies a CRC32C),
* the same through ``EncryptedStorage`` (AES-256-GCM chunked frames).

Each ratio is the median over ``--repeats`` of back-to-back pairs (order alternating), which keeps
load from other processes out of the ratios as far as possible. Prints ``ratio-upload-vs-boto3``,
``ratio-download-vs-boto3`` (boto3's time / ours, i.e. our throughput relative to boto3's; >= 1.0
means we are at least as fast) and ``ratio-encrypted-vs-plain`` (encrypted save time / plain save
time; <= 1.3 is the target), then a table of all runs.

    .venv/bin/python benchmarks/bench_storage.py --size-gb 1
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SPOTWISE_PLATFORM", "none")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto server did not start within 60 s")


def write_random_file(path: Path, size: int) -> None:
    block = os.urandom(16 * MiB)
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            n = min(len(block), size - written)
            # vary each block so nothing downstream can deduplicate or compress it
            fh.write(block[:n] if written % (32 * MiB) else os.urandom(n))
            written += n


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="checkpoint size in GiB")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    parser.add_argument("--part-mib", type=int, default=32, help="multipart part size (MiB)")
    parser.add_argument("--concurrency", type=int, default=8, help="parallel parts")
    args = parser.parse_args()

    import boto3
    from boto3.s3.transfer import TransferConfig

    from spotwise.storage.crypt import EncryptedStorage
    from spotwise.storage.s3 import S3Storage, TransferSettings

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    proc, url = start_moto()
    try:
        size = int(args.size_gb * 1024 * MiB)
        part = args.part_mib * MiB
        bucket = "spotwise-bench"
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket=bucket)
        transfer = TransferSettings(
            multipart_threshold=part, part_size=part, max_concurrency=args.concurrency
        )
        boto_config = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=args.concurrency
        )
        ours = S3Storage(bucket, "ours", endpoint_url=url, transfer=transfer)
        with tempfile.TemporaryDirectory(prefix="spotwise-bench-") as tmp:
            work = Path(tmp)
            src = work / "model.safetensors"
            write_random_file(src, size)
            crypted = EncryptedStorage(
                S3Storage(bucket, "enc", endpoint_url=url, transfer=transfer),
                os.urandom(32),
                spool_dir=work / "spool",
            )
            dest = work / "back.bin"

            def boto_up() -> None:
                client.upload_file(str(src), bucket, "boto/model.safetensors", Config=boto_config)

            def boto_down() -> None:
                client.download_file(
                    bucket, "boto/model.safetensors", str(dest), Config=boto_config
                )

            cases: dict[str, Callable[[], object]] = {
                "boto3 upload_file": boto_up,
                "spotwise put": lambda: ours.put("model.safetensors", src),
                "spotwise put encrypted": lambda: crypted.put("model.safetensors", src),
                "boto3 download_file": boto_down,
                "spotwise get": lambda: ours.get("model.safetensors", dest),
                "spotwise get encrypted": lambda: crypted.get("model.safetensors", dest),
            }
            # Paired measurements: each ratio compares two runs made back to back (their order
            # alternating), so load from other processes cancels out of the ratio as far as it can.
            pairs = {
                "ratio-upload-vs-boto3": ("boto3 upload_file", "spotwise put"),
                "ratio-download-vs-boto3": ("boto3 download_file", "spotwise get"),
                "ratio-encrypted-vs-plain": ("spotwise put encrypted", "spotwise put"),
                "ratio-encrypted-vs-plain-download": (
                    "spotwise get encrypted",
                    "spotwise get",
                ),
            }
            times: dict[str, list[float]] = {name: [] for name in cases}
            ratios: dict[str, list[float]] = {name: [] for name in pairs}
            for rep in range(args.repeats):
                for label, (a, b) in pairs.items():
                    order = (a, b) if rep % 2 == 0 else (b, a)
                    took = {name: timed(cases[name]) for name in order}
                    for name, seconds in took.items():
                        times[name].append(seconds)
                    ratios[label].append(took[a] / took[b])
                    print(f"  run {rep + 1}: {label} {took[a]:.2f}s / {took[b]:.2f}s",
                          file=sys.stderr, flush=True)  # fmt: skip
                assert dest.stat().st_size == size
            med = {name: statistics.median(values) for name, values in times.items()}
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    print(
        f"size: {size / MiB:.0f} MiB, part {args.part_mib} MiB x {args.concurrency} parallel, "
        f"{args.repeats} repeats (median of paired ratios), moto server in its own process"
    )
    for label, values in ratios.items():
        print(f"{label}: {statistics.median(values):.2f}")
    print()
    print(f"| {'case':<28} | {'median s':>9} | {'MiB/s':>8} | {'runs (s)':<24} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 10}|{'-' * 26}|")
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name:<28} | {med[name]:>9.2f} | {size / MiB / med[name]:>8.0f} | {runs:<24} |")


if __name__ == "__main__":
    main()
