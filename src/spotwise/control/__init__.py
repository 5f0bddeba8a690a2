"""Job control: ``spotwise launch`` runs a job to the end across preemptions (see controller)."""
