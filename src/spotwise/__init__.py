"""spotwise: train on interruptible GPUs without losing work.

The public API is deliberately small; everything else lives in subpackages.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
