"""The acceptance rule of speculative decoding's replay (decoding/speculative.py): whether a drafted
advance is taken at a position, given the method's own choice there."""

from __future__ import annotations

from ensemble_bench.decoding.decode import Advance


class GreedyAcceptance:
    """The acceptance rule of a round's replay, in one place: the drafted advance at a position is taken
    when the method's own choice there is that advance, so the output is the every-token output.
    (Speculative sampling would put its rule here: take a drafted x ~ q with probability
    min(1, p(x)/q(x)), else draw the position's advance from norm(max(0, p - q)).)"""

    def accepts(self, chosen: Advance, drafted: Advance) -> bool:
        return chosen == drafted
