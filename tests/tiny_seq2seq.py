"""Tiny random encoder-decoder models and an NLLB-style tokenizer, built in the tests (no downloads)."""

from __future__ import annotations

import torch
from transformers import M2M100Config, M2M100ForConditionalGeneration, T5Config, T5ForConditionalGeneration

from tests.tiny import sentencepiece_tokenizer

LANGUAGE_CODES = ("eng_Latn", "deu_Latn", "ron_Latn")


def nllb_style_tokenizer():
    """The tests' SentencePiece tokenizer with NLLB's conventions: a pad distinct from EOS and the
    language codes as special tokens."""
    tok = sentencepiece_tokenizer()
    tok.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": list(LANGUAGE_CODES)})
    return tok


def _sharpen(model):
    """Larger logits so that greedy choices are far from ties (as tests/tiny.py does)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def tiny_m2m100(tokenizer, seed: int = 0) -> M2M100ForConditionalGeneration:
    """A 2+2-layer random M2M100 (NLLB's architecture: sinusoidal positions from padding_idx)."""
    torch.manual_seed(seed)
    config = M2M100Config(vocab_size=len(tokenizer), d_model=64, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                          decoder_ffn_dim=128, max_position_embeddings=1024, dropout=0.0,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                          bos_token_id=tokenizer.bos_token_id, decoder_start_token_id=tokenizer.eos_token_id,
                          tie_word_embeddings=False, scale_embedding=True)
    return _sharpen(M2M100ForConditionalGeneration(config))


def tiny_t5(tokenizer, seed: int = 0) -> T5ForConditionalGeneration:
    """A 2+2-layer random T5 (relative position biases; decoder starts from pad)."""
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a head unlike the input embeddings: else the random model copies its input (pad)
        model.lm_head.weight.normal_(0.0, 0.5)
    return model
