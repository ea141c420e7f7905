"""Members hand their KV cache to transformers as ``cache`` (``past_key_values`` is deprecated in 5.24
and removed in 5.40): no FutureWarning on any step, and remote code with the old name still works."""

from __future__ import annotations

import warnings

import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.members.kv import cache_argument
from ensemble_bench.members.seq2seq import Seq2SeqMember
from tests.tiny_seq2seq import tiny_t5


def test_a_local_member_steps_without_a_deprecation_warning(bpe_model, bpe_tokenizer):
    member = LocalMember(bpe_model, bpe_tokenizer, "a")
    ids = bpe_tokenizer.encode("The quick brown fox")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        member.prefill([ids, ids[:3]])
        member.extend([[ids[0]], [ids[1], ids[2]]])
        member.read_tree([[ids[0], ids[1]], [ids[2]]], [[-1, 0], [-1]])
    assert member.cache_argument == "cache"


def test_a_seq2seq_member_steps_without_a_deprecation_warning(sp_tokenizer):
    member = Seq2SeqMember(tiny_t5(sp_tokenizer), sp_tokenizer, "t5")
    ids = sp_tokenizer.encode("The quick brown fox", add_special_tokens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        member.prefill([ids])
        member.extend([[ids[0]]])
    assert member.cache_argument == "cache"


def test_a_forward_of_the_old_signature_gets_past_key_values():
    class OldRemoteCode(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
            return input_ids

    class NewModel(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None):
            return input_ids

    assert cache_argument(OldRemoteCode()) == "past_key_values"
    assert cache_argument(NewModel()) == "cache"
