"""Encode one shard's outputs as bytes: safetensors for tensors, Parquet for tables.

The bytes must depend only on the values (no timestamps, no writer identity), so a shard that is
recomputed after an interruption is byte-identical to the first try and the whole output equals
an uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from spotwise.errors import ConfigError
from spotwise.registry import require


def concat_tensors(
    parts: Sequence[Mapping[str, torch.Tensor]], rows: int
) -> dict[str, torch.Tensor]:
    """Join the per-batch outputs of one shard along the first dimension, checking that every
    batch returned the same names and one row per item."""
    if not parts:
        raise ConfigError("a shard produced no outputs")
    names = sorted(parts[0])
    for part in parts:
        if sorted(part) != names:
            raise ConfigError(
                f"the batch function returned outputs {sorted(part)} for one batch and {names} "
                "for another",
                hint="return the same dict keys for every batch",
            )
    joined = {n: torch.cat([p[n].detach().cpu() for p in parts]).contiguous() for n in names}
    for name, tensor in joined.items():
        if tensor.dim() == 0 or tensor.shape[0] != rows:
            raise ConfigError(
                f"output {name!r} has {tensor.shape[0] if tensor.dim() else 0} rows for a shard "
                f"of {rows} items",
                hint="return one row per input item (first dimension)",
            )
    return joined


def encode_tensors(tensors: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save(dict(tensors))


def encode_table(parts: Sequence[Any], rows: int) -> bytes:
    """Parquet bytes of the batches' tables (pyarrow Tables or dicts of columns)."""
    pa = require("pyarrow", "batch", "Parquet batch outputs")
    pq = require("pyarrow.parquet", "batch", "Parquet batch outputs")
    tables = [p if isinstance(p, pa.Table) else pa.table(dict(p)) for p in parts]
    table = pa.concat_tables(tables)
    if table.num_rows != rows:
        raise ConfigError(
            f"the shard's table has {table.num_rows} rows for {rows} items",
            hint="return one row per input item",
        )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())
