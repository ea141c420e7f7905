"""The machinery that runs the methods: the decode loop every generating method shares (``decode``),
draft and verify across tokenizers (``speculative``), how a chosen text reaches each member
(``feeding``), stop rules (``stopping``), members stepped side by side (``concurrent``) and per-run
statistics (``stats``). The methods themselves, one module per paper (and the scorers of whole
continuations), live in ``ensemble_bench.methods``; this package imports none of them."""
