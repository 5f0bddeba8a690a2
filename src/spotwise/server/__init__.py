"""`spotwise server`: one long-running process that drives every job's control loop for a team."""
