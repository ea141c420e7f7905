"""EVA's pivot (methods/eva.py): with no ``lead`` given, the member with the largest vocabulary, as the
paper chooses it ("the model with the largest vocabulary as the pivot model ... rather than selecting the
best-performing model"); a given lead is kept."""

from __future__ import annotations

from ensemble_bench.members import LocalMember
from ensemble_bench.methods.eva import Eva, EvaParams


def test_the_pivot_is_the_member_with_the_largest_vocabulary(bpe_model, bpe_tokenizer, sp_model, sp_tokenizer,
                                                             tmp_path, monkeypatch):
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    bpe, sp = LocalMember(bpe_model, bpe_tokenizer, "bpe"), LocalMember(sp_model, sp_tokenizer, "sp")
    sizes = {m.name: len(m.vocab.text_ids()) for m in (bpe, sp)}
    largest = max(sizes, key=sizes.get)
    assert sizes["bpe"] != sizes["sp"]
    for members in ([bpe, sp], [sp, bpe]):
        method = Eva(members, EvaParams())
        assert members[method.lead].name == largest and method.info()["eva"]["lead_index"] == method.lead
    assert Eva([bpe, sp], EvaParams(lead="bpe")).lead == 0 and Eva([bpe, sp], EvaParams(main=1)).lead == 1
    Eva.check_members(EvaParams(), ["bpe", "sp"])  # no lead to resolve before the vocabularies are known
