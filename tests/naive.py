"""Pieces shared by the naive, uncached reference implementations written in the method tests."""


def feed_chosen(members, appenders, seqs, emitter, token) -> None:
    """The emitter appends its token; every other member takes its bytes (re-tokenising a window)."""
    data = members[emitter].vocab.pieces[token]
    for i in range(len(members)):
        if i == emitter:
            seqs[i].append(token)
        else:
            plan = appenders[i].plan(seqs[i], data)
            seqs[i] = seqs[i][:len(seqs[i]) - plan.drop] + list(plan.ids)
