"""VOTING, the DeePEn paper's baseline for tasks with a fixed answer set (DeePEn Sec. 4.1, App. B):
each member answers alone; the most frequent answer wins; ties go to the main model's answer.

Generated answers are compared by an extracted key (``answer``):
- ``auto``: a GSM8K-style final "#### n", else "the answer is X", else a parenthesised letter
  "(B)", else the last number, else the first line; normalised (case, spaces, commas, a
  trailing period);
- ``text``: the whole answer, normalised the same way;
- any other string: a regular expression whose last match (group 1 if it has one) is the key.
Multiple-choice (log-likelihood) questions vote with each member's most likely choice.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from ensemble_bench.decoding.method import GenerationRequest
from ensemble_bench.methods.sample_level import SampleLevel, SampleLevelParams, choose_by_vote

_AUTO_PATTERNS = (re.compile(r"####\s*(-?[\d.,]+)"), re.compile(r"answer is\s*:?\s*\(?([^\n.)]+)", re.I),
                  re.compile(r"\(([A-J])\)"), re.compile(r"(-?\d[\d,]*(?:\.\d+)?)"))


class VotingParams(SampleLevelParams):
    answer: str = Field(default="auto", description=(
        "how answers are compared: auto (a final number, a letter, the first line), text, or a regular expression"))

    @field_validator("answer")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if value not in ("auto", "text"):
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
        return value


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower().replace(",", "")).rstrip(".").strip()


def last_match(pattern: re.Pattern, text: str) -> str | None:
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    return match.group(1) if pattern.groups else match.group(0)


def answer_key(text: str, answer: str) -> str:
    if answer == "text":
        return normalise(text)
    patterns = _AUTO_PATTERNS if answer == "auto" else (re.compile(answer),)
    for pattern in patterns:
        found = last_match(pattern, text)
        if found is not None:
            return normalise(found)
    lines = text.strip().splitlines()
    return normalise(lines[0] if lines else "")


class Voting(SampleLevel):
    name = "voting"
    Params = VotingParams
    inert_on_choices = frozenset({"answer"})

    def _choose(self, texts: list[str], request: GenerationRequest) -> int:
        keys = [answer_key(t, self.params.answer) for t in texts]
        winner = choose_by_vote(keys, self.lead)
        return self.lead if keys[self.lead] == winner else keys.index(winner)
