"""The command lines: ``ensbench`` (main), ``ensbench-lm-eval`` (lm_eval), their faults, the plan, the
listings, progress and the docs generator. Nothing in the package imports this layer."""
