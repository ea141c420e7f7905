"""Span-level ensembles (Cool-Fusion, SweetSpan): each round every member proposes a segment of
whole words from the shared prefix; every member scores every segment by perplexity with its own
tokenisation; one segment wins; every member appends it.

A round, batched over requests, with every member's KV cache kept at the committed prefix:
1. propose: each member decodes greedily from the prefix until ``_segment_end`` finds the end of
   its segment in its new text (or it emits a stop id, reaches the token budget or an ``until``
   string: a final segment); the tokens past the end are dropped (the cache is cropped back to
   the prefix plus the segment). The log-probs it read while decoding are its own scores of its
   segment;
2. score: each member feeds every other distinct segment from the prefix (its own tokenisation
   of the text) and reads the perplexity of its tokens off the forward pass (the prefix is never
   recomputed). A segment ended by a stop id also scores the member's best stop id at its end; one
   cut by ``until`` or the budget, its tokens only (a forward pass). One distinct segment: no scoring;
3. choose (``_choose``: Eq. 3's lowest mean perplexity, or SweetSpan's filtered mean; AdaFuse scores
   by mean negative log-likelihood, ``_span_score``);
4. commit: a member whose cache already ends with the winner (the last segment it fed) keeps it;
   the others are cropped to the prefix and append the winner's tokens. A round in which all
   members agree thus costs each member only its proposal's forward passes.

A member may propose several candidates in a round (``_proposals``; AdaFuse's exploration): each
further one is a ``Branch``, a forced start (the primary's first tokens, then another token)
completed greedily to a given number of words; the member's cache then holds the last one fed.

The text is the lead member's own decode of its committed tokens; the token budget counts the
lead member's tokens. Each round is recorded (candidates, perplexities, kept scores, winner) in
``self.traces`` (this sitting's requests), written next to the samples as ``span_trace.jsonl``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from pydantic import Field

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import FeedStats, Retokenize, cached_tail, member_continuation
from ensemble_bench.decoding.feeding import Held as TextHeld
from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    LoglikelihoodRequest,
    MethodParams,
    lead_field,
    resolve_member,
    rolling_with_members,
    score_with_members,
)
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.scorers import perplexity
from ensemble_bench.vocab.append import split_valid_utf8
from ensemble_bench.vocab.fast_topk import block_argmax
from ensemble_bench.vocab.words import common_ends


class SpanParams(MethodParams):
    lead: int | str = lead_field(0, "renders the text, counts the token budget, wins ties", "main")
    retokenize: Retokenize = Field(default="canonical", description=(
        "how members take a winner they did not propose (docs/retokenize.md): local, the segment encoded on its "
        "own; canonical, the text re-encoded back to the last hard boundary (the papers: each model encodes the "
        "committed text with its own tokenizer)"))


@dataclass(frozen=True)
class Branch:
    """A further candidate of one row: decode ``forced`` first, then greedily to the end of word ``words``."""
    forced: tuple[int, ...]
    words: int


@dataclass(frozen=True, eq=False)
class Proposal:
    text: str
    tokens: tuple[int, ...]  # the proposer's own ids for the text
    final: str | None        # why the proposer stops after it ("stop_id", "length", "until"), or None
    logprobs: tuple[float, ...] | None = None  # the proposer's scores of it (step 2's terms); None: not read
    after: torch.Tensor | None = None  # the proposer's next-token log-probs when its cache ends with it
    branches: tuple[Branch, ...] = ()  # the further candidates the proposer explores (``_branches``)


@dataclass(frozen=True, eq=False)
class Held:
    """What a member's cache holds past the prefix of one row: candidate ``index``, then ``after``."""
    index: int
    after: torch.Tensor


@dataclass
class SpanState(RequestState):
    """A request under a span method: its ids are the lead member's committed tokens."""

    rounds: list[dict] = field(default_factory=list)  # the rounds that had a choice (the trace)

    @property
    def text(self) -> str:
        """The committed text (whole segments: whole characters)."""
        return self.data.decode("utf-8")


def text_of(member: Member, tokens: Sequence[int]) -> str:
    """The text of a member's ids by their bytes (no decode-time space stripping), whole characters."""
    return split_valid_utf8(member.vocab.join(tokens))[0]


@dataclass
class SpanStats:
    rounds: int = 0  # span rounds: candidates proposed and scored


@dataclass(frozen=True)
class SpanReport(MethodStats):
    lead_index: int
    rounds: int  # span rounds: candidates proposed and scored
    retokenizing: dict = spread()


SPAN_CHOICES = "span-level methods score an option by their members' mean log-likelihood (no spans, no lead)"


class SpanMethod(DecodingMethod):
    min_members = 2
    lead_param = "lead"
    score_name = "perplexity"  # what the trace's table holds (``_span_score``)
    version = 2  # 2: a segment cut by ``until`` or the budget is not scored with a stop at its end

    def __init__(self, members: Sequence[Member], params: SpanParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)
        self.traces: list[dict] = []
        self.stats = SpanStats()
        self.feed_stats = FeedStats()
        self.tails = [cached_tail(m) for m in members] if params.retokenize == "canonical" else None

    @classmethod
    def check_members(cls, params: SpanParams, labels: Sequence[str]) -> None:
        resolve_member(params.lead, labels, params.lead_spelling)

    @abstractmethod
    def _segment_end(self, proposer: int, text: str, tokens: list[int], picked_from: list[torch.Tensor]) -> int | None:
        """Where this round's segment ends in the proposer's new ``text`` (None: generate more);
        ``tokens`` are its ids so far, ``picked_from`` the log-prob rows each was picked from."""

    def _branches(self, proposer: int, tokens: list[int], picked_from: list[torch.Tensor],
                  proposal: Proposal) -> tuple[Branch, ...]:
        """The further candidates a member explores beside its greedy ``proposal`` (none here); ``tokens``
        are all the ids it decoded, ``picked_from`` the log-prob rows each was picked from."""
        return ()

    def _span_score(self, logprobs: Sequence[float]) -> float:
        """One member's score of one candidate from its log-probs (lower wins): perplexity (Eq. 1-2)."""
        return perplexity(logprobs)

    def _word_end(self, text: str, words: int) -> int | None:
        """The end of the ``words``-th complete word of ``text`` (common boundaries), once known."""
        ends = self._common_ends(text)
        return ends[words - 1] if len(ends) >= words else None

    def _choose(self, table: list[list[float]]) -> tuple[int, list[list[bool]]]:
        """Eq. 3: the candidate with the lowest mean perplexity over members (ties: the first)."""
        means = [sum(row) / len(row) for row in table]
        return means.index(min(means)), [[True] * len(row) for row in table]

    def _common_ends(self, text: str) -> list[int]:
        """Offsets in ``text`` where every member's tokenizer starts a word (Cool-Fusion Sec. 2.1-2.2)."""
        return common_ends([member.word_starts(text) for member in self.members])

    # --- generation: the loop's steps -------------------------------------------------------------
    def start(self, request: GenerationRequest) -> SpanState:
        return SpanState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[SpanState]) -> Round:
        """One round for every live row: propose (step 1), then score, choose and commit (2-4)."""
        prefix = [[len(ids) for ids in m.row_ids()] for m in self.members]
        for v, lengths in enumerate(prefix):
            for state, length in zip(states, lengths):
                state.held.setdefault(v, TextHeld(length))  # the first round starts at the prompt
        proposals = each(self.members, lambda _, u: self._proposals(u, states, dists[u], prefix[u]),
                         range(len(self.members)))
        choices = [self._candidates([p[k] for p in proposals]) for k in range(len(states))]
        dists, advances = self._commit(states, choices, dists, proposals, prefix)
        self.stats.rounds += 1
        return Round(advances, dists, by_span=True)

    def feed(self, dists, states, advances) -> list[torch.Tensor]:
        """Nothing left to give: the round's commit appended the winners."""
        return dists

    def result(self, state: SpanState, request: GenerationRequest) -> Generation:
        generation = super().result(state, request)
        self.traces.append({"prompt_tail": request.prompt.text[-200:] or str(request.prompt.messages)[-200:],
                            "output": generation.text, "rounds": state.rounds})
        return generation

    def _proposals(self, proposer: int, rows: list[SpanState], dist: torch.Tensor,
                   prefix: list[int]) -> list[list[Proposal]]:
        """Step 1 for one member: its candidates for each row (here one: its greedy segment)."""
        return [[proposal] for proposal in self._propose(proposer, rows, dist, prefix)]

    def _propose(self, proposer: int, rows: list[SpanState], dist: torch.Tensor, prefix: list[int],
                 branches: Sequence[Branch | None] | None = None) -> list[Proposal | None]:
        """Step 1 for one member over the live rows (``prefix``: its committed lengths; ``dist``: its
        log-probs there); leaves the member at the prefix plus its own segment where its cache holds
        all of it (else at the prefix). With ``branches``, decodes each row's branch from the prefix
        instead (None for a row without one: its cache is left as it is)."""
        member = self.members[proposer]
        held = [len(ids) for ids in member.row_ids()]
        if branches is not None:
            member.crop([n if branch else kept for n, kept, branch in zip(prefix, held, branches)])
        tokens: list[list[int]] = [[] for _ in rows]
        # the distribution each token was picked from: views, as ``extend`` returns a new tensor each call
        seen: list[list[torch.Tensor]] = [[] for _ in rows]
        active = [branches is None or branches[k] is not None for k in range(len(rows))]
        done: list[Proposal | None] = [None] * len(rows)
        while any(done[k] is None and active[k] for k in range(len(rows))):
            picks = block_argmax(dist).tolist()
            for k, row in enumerate(rows):
                if done[k] is None and active[k]:
                    seen[k].append(dist[k])
                    branch = branches[k] if branches is not None else None
                    forced = branch.forced if branch else ()
                    token = forced[len(tokens[k])] if len(tokens[k]) < len(forced) else picks[k]
                    done[k] = self._extend_proposal(proposer, row, tokens[k], token, seen[k], branch)
            growing = [[tokens[k][-1]] if done[k] is None and active[k] else [] for k in range(len(rows))]
            if any(growing):
                dist = member.extend(growing)
        proposals = [self._self_scored(member, proposal, dists) if proposal else None
                     for proposal, dists in zip(done, seen)]
        if branches is None:
            proposals = [replace(p, branches=self._branches(proposer, ids, dists, p))
                         for p, ids, dists in zip(proposals, tokens, seen)]
        member.crop([n + (len(p.tokens) if p.after is not None else 0) if p else kept
                     for n, kept, p in zip(prefix, held, proposals)])
        return proposals

    @staticmethod
    def _self_scored(member: Member, proposal: Proposal, seen: list[torch.Tensor]) -> Proposal:
        """The proposal with the proposer's own log-probs of it, where decoding read all of them and
        fed all its tokens (not after an ``until`` / ``length`` stop: its last token was not fed)."""
        count = len(proposal.tokens)
        if proposal.final not in (None, "stop_id") or count >= len(seen):
            return proposal
        logprobs = [float(seen[j][token]) for j, token in enumerate(proposal.tokens)]
        if proposal.final == "stop_id":
            logprobs.append(max(float(seen[count][s]) for s in member.stop_ids))
        return replace(proposal, logprobs=tuple(logprobs), after=seen[count])

    def _extend_proposal(self, proposer: int, row: SpanState, tokens: list[int], token: int,
                         picked_from: list[torch.Tensor], branch: Branch | None = None) -> Proposal | None:
        member = self.members[proposer]
        if token in member.stop_ids:
            return Proposal(text_of(member, tokens), tuple(tokens), "stop_id")
        tokens.append(token)
        text = text_of(member, tokens)
        if any(u and u in row.text + text for u in row.rule.until):
            return Proposal(text, tuple(tokens), "until")
        if len(tokens) >= row.rule.max_new_tokens - row.count:
            return Proposal(text, tuple(tokens), "length")
        if branch is not None:
            end = self._word_end(text, branch.words) if len(tokens) > len(branch.forced) else None
        else:
            end = self._segment_end(proposer, text, tokens, picked_from)
        if end is None:
            return None
        size = len(text[:end].encode("utf-8"))
        for count in range(1, len(tokens) + 1):
            if len(member.vocab.join(tokens[:count])) == size:
                return Proposal(text[:end], tuple(tokens[:count]), None)
        return None  # the end falls inside one of the proposer's tokens: keep generating

    def _candidates(self, proposals: list[list[Proposal]]) -> dict:
        """The distinct candidates of one row (in the members' order, each member's in its order) and
        each member's tokens for each of them."""
        candidates: dict[tuple[str, str | None], dict[int, tuple[int, ...]]] = {}
        for proposer, own in enumerate(proposals):
            for proposal in own:
                candidates.setdefault((proposal.text, proposal.final), {}).setdefault(proposer, proposal.tokens)
        keys = list(candidates)
        per_member = [[candidates[key].get(v) or tuple(self._encode(v, key[0])) for key in keys]
                      for v in range(len(self.members))]
        own = [[v in candidates[key] for key in keys] for v in range(len(self.members))]
        return {"keys": keys, "tokens": per_member, "own": own}

    def _encode(self, member_index: int, text: str) -> list[int]:
        return member_continuation(self.members[member_index])(text) if text else []

    def _commit(self, states: list[SpanState], rounds: list[dict], dists: list[torch.Tensor],
                proposals: list[list[Proposal]], prefix: list[list[int]]) -> tuple[list[torch.Tensor], list[Advance]]:
        """Steps 2-4 for all rows at once: score (where there is a choice), choose, append. Returns
        the members' next log-probs and what each row takes (the main member's tokens of the winner)."""
        scored = each(self.members, lambda _, v: self._score(v, rounds, dists[v], proposals[v], prefix[v]),
                      range(len(self.members)))
        winners, advances = [], []
        for k, (state, info) in enumerate(zip(states, rounds)):
            table = [[scored[v][0][k][j] for v in range(len(self.members))] for j in range(len(info["keys"]))]
            if len(info["keys"]) == 1:
                winner, kept = 0, [[True] * len(self.members)]
            else:
                winner, kept = self._choose(table)
                state.rounds.append({"candidates": [key[0] for key in info["keys"]],
                                     self.score_name: [[round(x, 4) for x in t] for t in table],
                                     "kept": kept, "winner": winner})
            winners.append(winner)
            text, final = info["keys"][winner]
            tokens = tuple(info["tokens"][self.lead][winner])
            advances.append(Advance(text.encode("utf-8"), tokens, len(tokens), final))
        dists = each(self.members, lambda m, v: self._append_winners(v, states, rounds, winners,
                                                                     scored[v][1], dists[v], prefix[v]),
                     range(len(self.members)))
        return dists, advances

    def _score(self, v: int, rounds: list[dict], dist: torch.Tensor, proposals: list[list[Proposal]],
               prefix: list[int]) -> tuple[list[list[float]], list[Held | None]]:
        """Step 2 for member ``v``: per row, its score of each candidate (0.0 where the row has no
        choice; its own candidates from the log-probs it read proposing them) and what its cache
        holds past the prefix afterwards."""
        member = self.members[v]
        scores = [[0.0] * len(info["keys"]) for info in rounds]
        held: list[Held | None] = []
        todo: list[list[int]] = []
        for k, (info, own) in enumerate(zip(rounds, proposals)):
            known: dict[int, Proposal] = {}
            held.append(None)
            for proposal in (p for p in own if p.logprobs is not None):
                j = info["keys"].index((proposal.text, proposal.final))
                if proposal.tokens == info["tokens"][v][j]:
                    known.setdefault(j, proposal)
                    if proposal.after is not None:
                        held[k] = Held(j, proposal.after)
            if len(info["keys"]) > 1:
                for j, proposal in known.items():
                    scores[k][j] = self._span_score(proposal.logprobs)
            todo.append([j for j in range(len(info["keys"])) if j not in known] if len(info["keys"]) > 1 else [])
        for step in range(max(len(t) for t in todo)):
            fed = [k for k in range(len(rounds)) if step < len(todo[k])]
            member.crop([prefix[k] if k in fed else len(ids) for k, ids in enumerate(member.row_ids())])
            feed = [list(rounds[k]["tokens"][v][todo[k][step]]) if k in fed else [] for k in range(len(rounds))]
            after, scored = member.extend_scored(feed)
            for k in fed:
                j, tokens = todo[k][step], feed[k]
                logprobs = ([float(dist[k, tokens[0]])] + scored[k]) if tokens else []
                end = after[k] if tokens else dist[k]
                if rounds[k]["keys"][j][1] == "stop_id":  # the segment ended the text: the member's stop
                    logprobs.append(max(float(end[s]) for s in member.stop_ids) if member.stop_ids else -1e30)
                scores[k][j] = self._span_score(logprobs)
                held[k] = Held(j, end)
        return scores, held

    def _append_winners(self, v: int, states: list[SpanState], rounds: list[dict], winners: list[int],
                        held: list[Held | None], dist: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        """Step 4 for member ``v``: rows whose cache ends with the winner (as it takes it) keep it; the
        others go back to where it takes the winner from and append it. Returns the member's
        next-token log-probs of every row."""
        member = self.members[v]
        rows = member.row_ids()
        takes = [self._take(v, state, info, w, row[:n])
                 for state, info, w, row, n in zip(states, rounds, winners, rows, prefix)]
        keeps = [h is not None and h.index == w and start == n and ids == list(info["tokens"][v][w])
                 for h, w, (start, ids), n, info in zip(held, winners, takes, prefix, rounds)]
        member.crop([len(row) if keep else start for row, keep, (start, _) in zip(rows, keeps, takes)])
        feed = [[] if keep else ids for keep, (_, ids) in zip(keeps, takes)]
        out = member.extend(feed)
        for k, keep in enumerate(keeps):
            if keep:
                out[k] = held[k].after
            elif not feed[k]:  # an empty winner: the member stays at the prefix
                out[k] = dist[k]
        return out

    def _take(self, v: int, state: SpanState, info: dict, winner: int, committed: list[int]) -> tuple[int, list[int]]:
        """Where member ``v`` takes row's winner from (its held length) and the ids it appends: its own
        ids when it proposed the winner; else the segment's ids (local) or the committed text
        re-encoded back to its last hard boundary (canonical)."""
        ids = list(info["tokens"][v][winner])
        if info["own"][v][winner]:
            return len(committed), ids
        if self.tails is None:
            self.feed_stats.add(0, len(ids))
            return len(committed), ids
        start = state.held[v].prompt_len
        plan = self.tails[v].plan(committed[start:], b"", info["keys"][winner][0].encode("utf-8"))
        self.feed_stats.add(len(committed) - start - plan.keep, len(plan.ids))
        return start + plan.keep, list(plan.ids)

    # --- scoring (multiple choice) -----------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        """Span methods are generation methods: a continuation's log-likelihood is the members' mean
        log-likelihood (each with its own tokenisation); greedy when greedy for every member."""
        per_member = score_with_members(self.members, requests, self.batch_size)
        return [Score(sum(s[k].logprob for s in per_member) / len(per_member), all(s[k].is_greedy for s in per_member))
                for k in range(len(requests))]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        totals = rolling_with_members(self.members, texts, self.batch_size)
        return [sum(values) / len(values) for values in zip(*totals)]

    def statistics(self) -> SpanReport:
        return SpanReport(lead_index=self.lead, rounds=self.stats.rounds,
                          retokenizing=self.feed_stats.summary(self.params.retokenize))
