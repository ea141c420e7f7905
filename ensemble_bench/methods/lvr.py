"""Lossless vocabulary reduction (LVR): every member becomes, exactly, a model over the members'
common vocabulary, and the ensemble averages next-common-token distributions ("Lossless
Vocabulary Reduction for Auto-Regressive Language Models", Chijiwa et al., ICLR 2026, arXiv
2510.08102). Like ``byte_level`` it needs no alignment, but it steps over common tokens, not bytes.

The maximal common vocabulary C and each member's nested tokenisation dec (its tokens spelled in
common tokens) are vocab/common.py: by default (``vocabulary: merges``) C is the members' shared
tokens closed under their BPE merges and dec is each member's BPE restricted to C, as two secondary
sources describe the paper's MCV ("intersecting vocabularies and restricting BPE merges"; the
method section itself could not be read); ``vocabulary: intersection`` is the earlier rule (every
shared token, dec by longest common token first). Member i's reduced model gives a C-sequence y_1..y_s the mass of its
token sequences whose map dec(x_1)...dec(x_T) starts with y (the paper's relative cover: the
last token is the first whose map reaches past y). Grouped by the C boundary k where the last
token starts, with the trunk x_1..x_{T-1} the member's canonical encoding c_k of bytes(y_1..y_k)
(which must map to exactly y_1..y_k):

    M_i(c | y) = sum_k P_i(c_k) * sum_{t : dec(t) starts with y_{k+1..s} c} p_i(t | c_k),
    M_i(end | y) = P_i(c_s) * sum_{stop} p_i(stop | c_s),

normalised over C and the end: ByteSampler's covering tree (vocab/covering.py) with tokens
spelled in common tokens instead of bytes. The loop is methods/covering_decoder.py, shared with
``byte_level``: the branches at common-token boundaries, the members' canonical re-tokenisation
after every chosen common token (one scored forward per member and step), the weighted average
over the members with a live branch, greedy argmax (or the end of the text). A member token that
cannot be spelled in C (a base symbol not in C) leaves the reduced model (its mass is lost: documented).

Exactness (tests/methods/test_lvr.py): for a model that gives mass only to canonical
tokenisations, the product of the reduced steps of a text's common tokens and the end equals the
model's probability of the text.

Log-likelihood: the continuation in common tokens, teacher-forced through the same loop (log q of
each forced common token): the lead's canonical tokens of the continuation, each nested (the lead's
reduced model then reads its own segmentation), or, when those do not spell its bytes, the bytes
spelled longest common token first (vocab/common.py); a continuation no common tokens spell scores
-inf. ``loglikelihood_rolling`` averages the members' own
whole-text probabilities, as ``byte_level`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ensemble_bench.decoding.decode import decode_batch
from ensemble_bench.decoding.method import Timing
from ensemble_bench.decoding.stopping import StopRule
from ensemble_bench.decoding.teacher_forced import TeacherForced
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.byte_level import ByteLevel, CoveringReport
from ensemble_bench.methods.covering_decoder import CoverState, ScoringState
from ensemble_bench.methods.lvr_params import LvrParams, LvrSpec
from ensemble_bench.vocab.common import BpeSpeller, CommonSpeller, common_vocabulary, member_merges
from ensemble_bench.vocab.covering import SortedVocab


@dataclass(frozen=True)
class LvrReport(CoveringReport):
    common_vocabulary: int = 0  # the members' common tokens


class Lvr(LvrSpec, ByteLevel):

    def __init__(self, members: Sequence[Member], params: LvrParams, batch_size: int = 1):
        excluded = [m.vocab.special_ids | m.stop_ids for m in members]
        merges = [member_merges(m.vocab.pieces, m.vocab.merges) if params.vocabulary == "merges" else []
                  for m in members]
        self.speller = CommonSpeller(common_vocabulary([m.vocab.pieces for m in members], excluded, merges))
        nesters = [BpeSpeller(self.speller, own) if own else self.speller for own in merges]
        self.spellings = [nest.nested(m.vocab.pieces, skip) for nest, m, skip in zip(nesters, members, excluded)]
        self.first_bytes = [piece[0] for piece in self.speller.common]
        super().__init__(members, params, batch_size)

    def member_vocabs(self) -> list[SortedVocab]:
        return [SortedVocab(spelled, frozenset(), end=len(self.speller.common)) for spelled in self.spellings]

    def statistics(self) -> LvrReport:
        return LvrReport(lead_index=self.lead, common_vocabulary=len(self.speller.common),
                         steps=self.stats.summary(len(self.members), "common_token"))

    def reads_prompt_as_bytes(self) -> bool:
        return False  # the prompt keeps its tokens (byte_level's prompt_rule is not offered)

    def symbol_bytes(self, symbol: int) -> bytes:
        return self.speller.common[symbol]

    def spelling(self, symbols: Sequence[int]) -> tuple[int, ...]:
        return tuple(symbols)

    def opens(self, i: int, trunk: Sequence[int], state: CoverState) -> bool:
        """The trunk maps to exactly the common tokens so far (dec(c_k) = y_1..y_k)."""
        return self.speller.spells(self.spellings[i], trunk, state.symbols)

    def _score_batch(self, splits: list[tuple[list[list[int]], bytes]]) -> list[Score]:
        """The loop, teacher-forced over the continuation's common tokens (``_forced``)."""
        forced = [self._forced(data) for _, data in splits]
        live = [k for k, symbols in enumerate(forced) if symbols]
        states = [ScoringState(StopRule((), len(forced[k])), forced=forced[k]) for k in live]
        if states:
            decode_batch(TeacherForced(self), [[splits[k][0][i] for k in live] for i in range(len(self.members))],
                         states, Timing())
        scores = [Score(0.0 if symbols == () else -math.inf, symbols == ()) for symbols in forced]
        for k, state in zip(live, states):
            scores[k] = Score(state.total, state.greedy)
        return scores

    def _forced(self, data: bytes) -> tuple[int, ...] | None:
        """The continuation's common tokens: the lead's canonical tokens of it, each nested; else longest first."""
        lead = self.members[self.lead]
        ids = lead.encode(data.decode("utf-8"), add_special_tokens=False)
        spelled = [self.spellings[self.lead][token] for token in ids]
        if ids and None not in spelled and lead.vocab.join(ids) == data:
            return tuple(symbol for symbols in spelled for symbol in symbols)
        return self.speller.spell(data)
