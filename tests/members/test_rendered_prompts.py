"""A chat request's record (members/rendered.py): each member's SHA-256 of the prompt it renders in
the context lm-eval logs as the samples' ``arguments``, and the first prompt's text in the model info."""

import hashlib
import json

from lm_eval.api.instance import Instance

from ensemble_bench.members import LocalMember
from ensemble_bench.members.rendered import RenderedPrompts, chat_prompt
from ensemble_bench.methods.single import Single
from ensemble_bench.run.answers import CHAT_MARK, to_prompt
from ensemble_bench.run.lm import EnsembleLM

FIRST = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2+2?\nA:"}]
SECOND = [{"role": "user", "content": "Q: 3+3?\nA:"}]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_each_member_records_the_hash_of_its_own_rendering_and_the_first_text(bpe_tokenizer, bpe_model):
    templated = LocalMember(bpe_model, bpe_tokenizer, "templated")
    plain = LocalMember(bpe_model, bpe_tokenizer, "plain", chat_template=False)
    rendered = RenderedPrompts()
    assert rendered.info() == {}
    record = rendered.record([templated, plain], FIRST)
    texts = {m.name: m.render_text(chat_prompt(FIRST)) for m in (templated, plain)}
    assert texts["templated"] != texts["plain"] == "Be brief.Q: 2+2?\nA:"
    assert record == {"messages": FIRST, "rendered_sha256": {name: sha256(t) for name, t in texts.items()}}
    rendered.record([templated, plain], SECOND)  # later prompts are hashed, the first text stays
    assert rendered.info() == {"rendered_prompts": {name: {"sha256": sha256(t), "first_text": t}
                                                    for name, t in texts.items()}}


def test_the_logged_chat_context_names_each_members_prompt_and_still_drives_generation(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "tiny")
    lm = EnsembleLM(Single([member], Single.Params(), batch_size=1), "tiny")
    context = lm.apply_chat_template(FIRST)
    text = member.render_text(chat_prompt(FIRST))
    assert context.startswith(CHAT_MARK) and text not in context  # a hash, not the whole prompt, per request
    assert json.loads(context[len(CHAT_MARK):])["rendered_sha256"] == {"tiny": sha256(text)}
    assert to_prompt(context) == chat_prompt(FIRST)
    assert lm.get_model_info()["ensbench"]["rendered_prompts"]["tiny"]["first_text"] == text

    def generate(prompt: str) -> str:
        request = Instance(request_type="generate_until", doc={}, idx=0,
                           arguments=(prompt, {"until": ["@@"], "max_gen_toks": 8}))
        return lm.generate_until([request])[0]

    assert generate(context) == generate(text)  # the member sees the text the hash names
