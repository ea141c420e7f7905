"""Pure functions over vocabularies (no models): byte views of tokens, and the maps built on them."""

from ensemble_bench.vocab.bytes_view import VocabView, build_vocab_view

__all__ = ["VocabView", "build_vocab_view"]
