"""What one machine must have: read by the job spec and by every provider, so it lives below
both (a provider importing ``spec`` would close a loop through the provider registry)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Resources(BaseModel):
    """What one machine must have. ``gpu`` is a catalog name (V100, A100...) or absent."""

    model_config = ConfigDict(extra="forbid")
    gpu: str | None = None
    gpu_count: int = Field(default=0, ge=0, le=64)
    instance_type: str | None = None  # e.g. p3.2xlarge: what the sim bills and SLURM ignores
    cpus: int = Field(default=1, ge=1, le=1024)
