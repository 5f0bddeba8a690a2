"""The fault proxy lives in spotwise.emulators (``spotwise emulate ec2`` uses it too)."""

from spotwise.emulators.fault_proxy import Fault, FaultProxy, Seen

__all__ = ["Fault", "FaultProxy", "Seen"]
