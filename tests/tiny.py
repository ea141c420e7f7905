"""Tiny tokenizers and random models built in the tests themselves (no downloads)."""

from __future__ import annotations

from dataclasses import replace

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Question: What is 12 plus 30? Answer: 42.",
    "Multi-tasking models answer questions about science, history and maths.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Café, naïve, jalapeño: words with accents. 東京 is Tokyo. Emoji: 🙂!",
    "James and Jamie went to the market; they bought apples, pears and bread.",
    "def add(a, b):\n    return a + b\n",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_bpe_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style 'Ġ' spelling) with chat special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def sentencepiece_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE ('▁' for spaces, <0xNN> byte fallback), Llama-2 conventions, no chat template."""
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    trainer_tok.train_from_iterator(CORPUS, trainer)
    learned = trainer_tok.model.get_vocab() if hasattr(trainer_tok.model, "get_vocab") else trainer_tok.get_vocab()
    import json
    merges = json.loads(trainer_tok.to_str())["model"]["merges"]
    vocab = {t: i for t, i in sorted(learned.items(), key=lambda kv: kv[1])}
    spelled = {t.replace("▁", " ").encode() for t in vocab}
    for byte in range(256):  # byte fallback for every byte no piece spells already (no duplicates)
        if bytes([byte]) not in spelled:
            vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens(specials)
    from tokenizers.processors import TemplateProcessing
    tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                            special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="</s>")


def tiny_llama(vocab_size: int, seed: int = 0, head_size: int | None = None) -> LlamaForCausalLM:
    """A 2-layer random Llama in float32; ``head_size`` > vocab pads the head like Qwen does."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=head_size or vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits so greedy choices are far from ties
        model.lm_head.weight.mul_(8.0)
    return model


# Five prompts of different lengths, mixed stop strings and budgets: the identity and
# fast == slow tests of every method run on these.
REQUESTS = [GenerationRequest(Prompt(text=CORPUS[i][: 12 + 9 * i]), ("@@",) if i % 2 else ("\n\n",), 10 + 3 * i)
            for i in range(5)]


def outputs(method, requests=REQUESTS):
    """(text, new tokens) of each generation."""
    return [(g.text, g.new_tokens) for g in method.generate(requests)]


def sampled(requests=REQUESTS, seed: int = 1234, repeat: int = 0, **settings) -> list[GenerationRequest]:
    """The requests drawing with ``settings`` (temperature 1 unless given), each with its own generator."""
    params = SamplingParams(do_sample=True, **settings)
    return [replace(r, sampling=RequestSampling(params, seed, request_key(r.prompt.text, {"until": r.until}), repeat))
            for r in requests]
