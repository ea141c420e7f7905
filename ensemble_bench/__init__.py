"""ensemble-bench: benchmark training-free ensembles of LLMs with different tokenizers."""

__version__ = "0.1.0"
