"""Reports: the summary table of a run (and, later, paper-mirroring tables and plots)."""
