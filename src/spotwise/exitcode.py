"""The one exit code of an attempt that was interrupted with its state saved.

75 is ``EX_TEMPFAIL`` from ``sysexits.h``: "try again later". The runtime exits with it after an
emergency save; the controller, the launcher and the manifests read it as "preempted, relaunch"
rather than as a failure. It lives in a module of its own so the controller can use it without
importing torch.
"""

from __future__ import annotations

EXIT_INTERRUPTED = 75

__all__ = ["EXIT_INTERRUPTED"]
