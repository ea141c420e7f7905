"""vLLM members (``backend: vllm``) on the packaged models: the equalities docs/backends.md states.

Run by ``make test-vllm`` in the ``.venv-vllm`` environment; skipped where ``import vllm`` fails (the
main environment has no vllm). Engines are small: 512-token windows, a 256 MiB KV cache, one thread.
"""

import pytest

try:
    import vllm  # noqa: F401
except Exception as err:  # noqa: BLE001 - a broken install (CUDA torchvision) raises RuntimeError, not ImportError
    pytest.skip(f"vllm does not import here ({type(err).__name__}); make test-vllm runs these", allow_module_level=True)

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import torch  # noqa: E402

from ensemble_bench.decoding.speculation_stats import SteadyCosts, SteadyPace  # noqa: E402
from ensemble_bench.decoding.stopping import cut_at_until  # noqa: E402
from ensemble_bench.errors import UserError  # noqa: E402
from ensemble_bench.members import Prompt, load_member  # noqa: E402
from ensemble_bench.members.vllm_engine import STEPPING  # noqa: E402
from ensemble_bench.methods import GenerationRequest  # noqa: E402
from ensemble_bench.methods.gac import Gac, GacParams  # noqa: E402
from ensemble_bench.methods.single import Single  # noqa: E402
from ensemble_bench.methods.unite import Unite, UniteParams  # noqa: E402
from tests.tolerances import OTHER_ENGINE, assert_close

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

ENGINE = {"max_model_len": 512, "max_num_seqs": 8, "kv_cache_gib": 0.25}
# A block read in one engine step runs vLLM's prefill path (a multi-token query over the cached prefix)
# where forced one-token steps run its decode path. Measured on this CPU build, float32, at this test's
# rows and two others: bit-identical (gap 0) for SmolLM2 and Qwen2.5. Another build or device may sum
# in another order or blocking; float32 rounding through ~30 layers of 576-896-wide sums stays orders
# below 1e-3, the bound the backend comparisons use too.
TOLERANCE = 1e-3
QUESTIONS = ["What is 15 + 27?", "Name the capital of France.", "Write one sentence about café culture in 東京.",
             "def fibonacci(n):"]
TEXTS = ["The capital of France is", "Question: What is 7 times 8?\nAnswer:", "Multi-tasking means"]


def chat_requests(tokens: int) -> list[GenerationRequest]:
    return [GenerationRequest(Prompt(messages=(("user", q),)), ("\n\n",), tokens) for q in QUESTIONS]


def text_requests(tokens: int) -> list[GenerationRequest]:
    return [GenerationRequest(Prompt(text=t), ("\n\n",), tokens) for t in TEXTS]


@pytest.fixture(scope="module")
def smollm_vllm():
    return load_member("smollm2-135m", name="smollm-vllm", chat_template=True, backend="vllm", vllm=ENGINE)


@pytest.fixture(scope="module")
def smollm_twin():
    return load_member("smollm2-135m", name="smollm-twin", chat_template=True, backend="vllm", vllm=ENGINE)


@pytest.fixture(scope="module")
def qwen_vllm():
    return load_member("qwen2.5-0.5b", name="qwen-vllm", chat_template=True, backend="vllm", vllm=ENGINE)


@pytest.fixture(scope="module")
def transformers_pair():
    return [load_member("smollm2-135m", name="smollm", chat_template=True),
            load_member("qwen2.5-0.5b", name="qwen", chat_template=True)]


def texts(method, requests) -> list[str]:
    return [g.text for g in method.generate(requests)]


def test_single_equals_vllms_own_greedy_generate(smollm_vllm):
    """``single`` steered token by token == vLLM's own greedy generation of the same prompts, cut at
    the first stop id and at ``until`` as the decode loop cuts."""
    requests = text_requests(24)
    plain = smollm_vllm.generate_plain([smollm_vllm.render(r.prompt) for r in requests], 24)
    expected = [cut_at_until(smollm_vllm.decode(cut_at_stop(ids, smollm_vllm.stop_ids)), r.until)
                for ids, r in zip(plain, requests)]
    assert texts(Single([smollm_vllm], Single.Params(), batch_size=3), requests) == expected


def cut_at_stop(ids: list[int], stops) -> list[int]:
    return next((ids[:k] for k, token in enumerate(ids) if token in stops), ids)


def test_member_with_itself_equals_the_member_alone(smollm_vllm, smollm_twin):
    requests = chat_requests(24)
    alone = texts(Single([smollm_vllm], Single.Params(), batch_size=4), requests)
    assert texts(Gac([smollm_vllm, smollm_twin], GacParams(), batch_size=4), requests) == alone
    assert texts(Unite([smollm_vllm, smollm_twin], UniteParams(), batch_size=4), requests) == alone


@pytest.mark.parametrize("method", ["gac", "unite"])
def test_vllm_members_equal_transformers_members(method, smollm_vllm, qwen_vllm, transformers_pair):
    """The same weights on both backends give the same text (a float near-tie would show as a first
    differing token whose two candidates' log-probs nearly meet: reported in the failure)."""
    build = {"gac": lambda ms: Gac(ms, GacParams(), batch_size=4),
             "unite": lambda ms: Unite(ms, UniteParams(), batch_size=4)}[method]
    requests = chat_requests(24)
    assert texts(build([smollm_vllm, qwen_vllm]), requests) == texts(build(transformers_pair), requests)


def test_distributions_match_transformers(smollm_vllm, transformers_pair):
    """Prefill and a few steps: vLLM's float32 log-probs equal transformers' within OTHER_ENGINE, same argmax."""
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    ours, theirs = smollm_vllm.prefill(rows), transformers_pair[0].prefill(rows)
    for _ in range(4):
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
        assert_close(ours, theirs, OTHER_ENGINE)
        chosen = [[t] for t in ours.argmax(-1).tolist()]
        ours, theirs = smollm_vllm.extend(chosen), transformers_pair[0].extend(chosen)


def test_crops_several_tokens_and_empty_rows(smollm_vllm, transformers_pair):
    """Rows cropped, given several tokens, or nothing (re-submitted with prefix caching) hold the
    same distributions as a transformers member given the same calls."""
    local = transformers_pair[0]
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    smollm_vllm.prefill(rows)
    local.prefill(rows)
    calls = [("extend", [[11], [12], [13]]), ("extend", [[5, 6], [7], []]), ("crop", [len(rows[0]), None, None]),
             ("extend", [[21, 22, 23], [24], [25]]), ("extend", [[1], [2], [3]])]
    for kind, arg in calls:
        if kind == "crop":
            held = [len(r) for r in local.row_ids()]
            lengths = [n if n is not None else h for n, h in zip(arg, held)]
            smollm_vllm.crop(lengths)
            local.crop(lengths)
            continue
        ours, theirs = smollm_vllm.extend(arg), local.extend(arg)
        assert_close(ours, theirs, OTHER_ENGINE)
    assert smollm_vllm.row_ids() == local.row_ids()


def test_extend_scored_and_score_match_transformers(smollm_vllm, transformers_pair):
    local = transformers_pair[0]
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    smollm_vllm.prefill(rows)
    local.prefill(rows)
    feed = [[11, 12, 13], [14], [15, 16]]
    (_, ours), (_, theirs) = smollm_vllm.extend_scored(feed), local.extend_scored(feed)
    assert [len(s) for s in ours] == [2, 0, 1]
    assert_close(ours, theirs, OTHER_ENGINE)
    lengths = [len(r) for r in local.row_ids()]
    smollm_vllm.crop([n - 1 for n in lengths])  # every row re-submitted: the longest forces two tokens
    local.crop([n - 1 for n in lengths])
    feed = [[17, 18], [19], [20, 21, 22]]
    (ours_dist, ours), (theirs_dist, theirs) = smollm_vllm.extend_scored(feed), local.extend_scored(feed)
    assert [len(s) for s in ours] == [1, 0, 2]
    assert_close(ours_dist, theirs_dist, OTHER_ENGINE)
    assert_close(ours, theirs, OTHER_ENGINE)
    pairs = [(rows[0], smollm_vllm.encode(" Paris", add_special_tokens=False)), (rows[1], [220, 20])]
    for mine, other in zip(smollm_vllm.score(pairs), local.score(pairs)):
        assert_close(mine.logprob, other.logprob, OTHER_ENGINE)
        assert mine.is_greedy == other.is_greedy


@pytest.mark.parametrize("params", [GacParams(speculative=4), GacParams(speculative=4, threshold=0.5)],
                         ids=["plain", "gated"])
def test_speculative_gac_equals_every_token_gac(params, smollm_vllm, qwen_vllm):
    """Draft and verify on vLLM members (blocks read in drafted steps, rejected tails rejected inside
    vLLM) gives the every-token tokens; the speculative run did reject drafts in place."""
    every = params.model_copy(update={"speculative": 0})
    requests = chat_requests(24)
    expected = texts(Gac([smollm_vllm, qwen_vllm], every, batch_size=4), requests)
    method = Gac([smollm_vllm, qwen_vllm], params, batch_size=4)
    method.speculation.costs, method.speculation.pace = SteadyCosts(), SteadyPace()  # the test is of drafted rounds
    before = smollm_vllm.rejected + qwen_vllm.rejected
    assert texts(method, requests) == expected
    assert smollm_vllm.rejected + qwen_vllm.rejected > before  # crops of drafts, rejected in their step


@pytest.fixture(scope="module")
def vllm_actors(ray_cluster, tmp_path_factory):
    """The two packaged members on vLLM as a recipe with placement ray builds them: each engine in a Ray
    actor of its own, one CPU each."""
    from ensemble_bench.recipe import parse_recipe
    from ensemble_bench.run.build import MemberPool

    specs = [{"model": model, "name": name, "chat_template": True, "backend": "vllm", "vllm": ENGINE, "num_cpus": 1}
             for model, name in (("smollm2-135m", "smollm-vllm"), ("qwen2.5-0.5b", "qwen-vllm"))]
    recipe = parse_recipe({"name": "actors", "members": specs, "method": "gac", "tasks": ["nq"], "data": "offline",
                           "placement": {"kind": "ray"}, "output": str(tmp_path_factory.mktemp("actors"))}, "r.yaml")
    pool = MemberPool(recipe)
    remote = [pool.get(0), pool.get(1)]  # both engines start side by side
    yield remote
    for member in remote:
        member.close()


def in_actor(member, read):
    """``read(vllm_member)`` run in the member's actor."""
    import ray

    return ray.get(member.actor.__ray_call__.remote(lambda server: read(server.member)))


@pytest.mark.parametrize("speculative", [0, 4])
def test_gac_over_vllm_members_in_ray_actors_equals_them_in_process(speculative, vllm_actors, smollm_vllm, qwen_vllm):
    """Each engine in its own actor process (its logits processor there) gives the tokens the same engines
    give in this process; speculative GaC also reads blocks over the wire and crops by re-submission."""
    requests = chat_requests(8)
    expected = texts(Gac([smollm_vllm, qwen_vllm], GacParams(), batch_size=4), requests)
    before = [in_actor(m, lambda member: member.rejected) for m in vllm_actors]
    method = Gac(vllm_actors, GacParams(speculative=speculative), batch_size=4)
    if speculative:
        method.speculation.costs, method.speculation.pace = SteadyCosts(), SteadyPace()  # drafts whatever the load
    assert texts(method, requests) == expected
    assert [in_actor(m, lambda member: type(member).__name__) for m in vllm_actors] == ["VllmMember"] * 2
    assert all(in_actor(m, lambda member: os.getpid()) != os.getpid() for m in vllm_actors)
    if speculative:  # rejected drafts were cropped: rejected in the actors' engines
        assert sum(in_actor(m, lambda member: member.rejected) for m in vllm_actors) > sum(before)


@pytest.fixture(params=["one pass", "one step per token"])
def read_mode(request, smollm_vllm):
    """Block reads in one engine step, and as an engine without a ``PromptReader`` gives them (one
    forced step per token)."""
    reader = smollm_vllm.steering.reader
    if request.param == "one step per token":
        smollm_vllm.steering.reader = None
    yield request.param
    smollm_vllm.steering.reader = reader


def test_read_block_matches_transformers(read_mode, smollm_vllm, transformers_pair):
    """Blocks of different lengths (one row given none), after a crop: the asked positions' log-probs
    equal a transformers member's block read within OTHER_ENGINE, and the next extend continues after them."""
    local = transformers_pair[0]
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    smollm_vllm.prefill(rows)
    local.prefill(rows)
    for blocks, at in [([[11, 12, 13], [14], []], [[0, 2], [0], []]),
                       ([[15, 16], [17, 18, 19, 20], [21, 22, 23]], [[0, 1], [1, 3], [2]])]:
        ours, theirs = smollm_vllm.read_block(blocks, at), local.read_block(blocks, at)
        assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs]
        for a, b in zip(ours, theirs):
            assert_close(a, b, OTHER_ENGINE)
        lengths = [len(r) - 1 for r in local.row_ids()]
        smollm_vllm.crop(lengths)
        local.crop(lengths)
        step = [[30], [31], [32]]
        assert_close(smollm_vllm.extend(step), local.extend(step), OTHER_ENGINE)
    assert smollm_vllm.row_ids() == local.row_ids()


def test_a_crop_inside_the_last_blocks_drafts_is_a_rejection_in_the_waiting_step(smollm_vllm, transformers_pair):
    """A speculative round's rejected tail: rows cropped by 3, 1 and 0 of the 4 tokens a block read
    gave them (the last 3 were drafts of one engine step), then their next tokens. No row is submitted
    again (vLLM's rejection sampler drops the drafts in the step the rows wait in), and the distributions
    equal a transformers member's. A row whose next token is the rejected draft itself is submitted again."""
    local = transformers_pair[0]
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    for member in (smollm_vllm, local):
        member.prefill(rows)
        member.extend([[11], [12], [13]])
    resubmitted, rejected = smollm_vllm.resubmitted, smollm_vllm.rejected
    for cut, step in [([3, 1, 0], [[30], [31], [32]]), ([2, 0, 0], [[23], [33], [34]])]:
        blocks, at = [[21, 22, 23, 24], [25, 26, 27, 28], [29, 30, 31, 32]], [[0, 1, 2, 3]] * 3
        for ours, theirs in zip(smollm_vllm.read_block(blocks, at), local.read_block(blocks, at)):
            assert_close(ours, theirs, OTHER_ENGINE)
        lengths = [len(r) - c for r, c in zip(local.row_ids(), cut)]
        smollm_vllm.crop(lengths)
        local.crop(lengths)
        assert_close(smollm_vllm.extend(step), local.extend(step), OTHER_ENGINE)
    assert smollm_vllm.row_ids() == local.row_ids()
    assert smollm_vllm.rejected == rejected + 2  # the first round's first two rows
    assert smollm_vllm.resubmitted == resubmitted + 1  # the second round's first row: 23 cropped, 23 given


def test_an_extend_that_gives_no_row_a_token_leaves_every_row_as_it_was(smollm_vllm, transformers_pair):
    """Every row given no token (SAFE's drafter after a wholly kept draft at batch 1): nothing reaches
    the engine; the next tokens are read after the rows' own text (a throwaway token 0 was forced)."""
    local = transformers_pair[0]
    rows = [smollm_vllm.encode(t) for t in TEXTS]
    smollm_vllm.prefill(rows)
    local.prefill(rows)
    for step in ([[]] * len(rows), [[40], [41], [42]], [[]] * len(rows), [[43], [44], [45]]):
        assert_close(smollm_vllm.extend(step), local.extend(step), OTHER_ENGINE)
    blocks, at = [[46, 47], [48, 49], [50, 51]], [[0, 1]] * len(rows)
    smollm_vllm.read_block([[]] * len(rows), [[]] * len(rows))
    local.read_block([[]] * len(rows), [[]] * len(rows))
    ours, theirs = smollm_vllm.read_block(blocks, at), local.read_block(blocks, at)
    for a, b in zip(ours, theirs):
        assert_close(a, b, OTHER_ENGINE)
    assert smollm_vllm.row_ids() == local.row_ids()


def test_a_kv_cache_too_small_for_the_window_is_one_line(smollm_vllm):
    """An engine whose cache cannot hold one request of its window: a UserError, not vLLM's ValueError;
    a running engine's cache as the member counts it (for its per-step check) holds its window."""
    with pytest.raises(UserError, match="cannot hold one request of its max_model_len"):
        load_member("smollm2-135m", name="tiny-cache", backend="vllm", vllm={**ENGINE, "kv_cache_gib": 0.001})
    assert ENGINE["max_model_len"] <= smollm_vllm.kv_blocks * smollm_vllm.block_size < 0.25 * 2**30 / 46080


def rows_of(member, lengths: list[int]) -> list[list[int]]:
    """Rows of exactly these lengths, cut from one long text (real tokens, so real distributions)."""
    ids = member.encode(" ".join(TEXTS) * 8)
    return [ids[:n] for n in lengths]


def forced_steps(member, rows, first, blocks) -> list[torch.Tensor]:
    """Each row's log-probs after every token of its block, the block forced one token per call."""
    member.prefill(rows)
    member.extend(first)
    dists = [member.extend([[block[j]] for block in blocks]) for j in range(len(blocks[0]))]
    return [torch.stack([d[r] for d in dists]) for r in range(len(rows))]


def assert_block_reading(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    gap = float((ours - theirs).abs().max())
    top = theirs.topk(2, dim=-1).values
    assert gap < TOLERANCE, f"{gap:.3g} apart"
    same = torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert same, f"argmax differs; smallest top-1/top-2 gap {float((top[:, 0] - top[:, 1]).min()):.3g}"


@pytest.mark.parametrize("model", ["smollm", "qwen"])
def test_a_block_read_is_one_engine_step_with_the_forced_steps_distributions(model, smollm_vllm, qwen_vllm):
    """A block of 4 after rows of 29, 27 and 45 held tokens (KV blocks of 32: the first row's block
    crosses a block boundary, the second's ends on one, the third's lies inside the second block):
    one engine step for the whole batch, and at every position the log-probs of 4 forced one-token
    steps (TOLERANCE), the same argmax; the rows go on from there as the forced rows do."""
    member = {"smollm": smollm_vllm, "qwen": qwen_vllm}[model]
    assert member.steering.reader is not None
    rows = rows_of(member, [29, 27, 45])
    first, blocks = [[11], [12], [13]], [[21, 22, 23, 24], [25, 26, 27, 28], [29, 30, 31, 32]]
    expected = forced_steps(member, rows, first, blocks)
    after = member.extend([[40], [41], [42]])
    member.prefill(rows)
    member.extend(first)
    assert member.max_drafts >= 3  # a drafted step: the first token forced where the rows wait, 3 drafts
    steps = member.steering.steps
    read = member.read_block(blocks, [[0, 1, 2, 3]] * 3)
    assert member.steering.steps - steps == 1
    for ours, theirs in zip(read, expected):
        assert_block_reading(ours, theirs)
    assert_block_reading(member.extend([[40], [41], [42]]), after)


def test_a_block_read_after_the_prefix_cache_is_emptied_computes_the_whole_row(smollm_vllm):
    """Rows parked (a plain request ran) and the prefix cache reset: the block read computes each
    row's whole prompt again, with the same distributions; rows given one token or none, and a
    subset of positions, as speculative rounds ask."""
    member = smollm_vllm
    rows = rows_of(member, [40, 33, 70])
    first, blocks = [[11], [12], [13]], [[21, 22, 23], [25], []]
    member.prefill(rows)
    member.extend(first)
    member.generate_plain([rows[0]], 1)
    with STEPPING:  # no step runs while the cache is reset
        assert member.engine.reset_prefix_cache()
    read = member.read_block(blocks, [[0, 2], [0], []])
    expected = forced_steps(member, rows[:2], first[:2], [[21, 22, 23], [25, 0, 0]])
    assert_block_reading(read[0], expected[0][[0, 2]])
    assert_block_reading(read[1], expected[1][[0]])
    assert read[2].shape == (0, member.vocab.size)


def test_threads_given_to_torch_run_a_vllm_member():
    """``--threads N`` (torch.set_num_threads before the engine starts) with OMP_NUM_THREADS unset: the
    engine thread used to start at OpenMP's default count while torch's first parallel call set N, and
    vLLM's CPU attention failed its check (``thread_num == thread_num (2 vs. 1)``). A fresh process,
    with a count other than OpenMP's default here."""
    threads = 1 if len(os.sched_getaffinity(0)) > 1 else 2
    script = textwrap.dedent(f"""
        import torch
        torch.set_num_threads({threads})
        from ensemble_bench.members import Prompt, load_member
        from ensemble_bench.methods import GenerationRequest
        from ensemble_bench.methods.single import Single
        member = load_member("smollm2-135m", name="m", backend="vllm", vllm={ENGINE!r})
        [out] = Single([member], Single.Params()).generate([GenerationRequest(Prompt(text="Paris is"), (), 4)])
        print("generated", out.new_tokens)
    """)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "generated 4" in done.stdout, done.stderr[-2000:]


def test_two_replicas_of_an_ensemble_of_vllm_members_answer_as_one_process(ray_cluster, smollm_vllm, smollm_twin,
                                                                           tmp_path):
    """``replicas: 2`` over vLLM members: two replica actors, each with its two engines, answer whole batches
    (greedy and sampled) with the texts the engines in this process give. SmolLM2 twice, so four small
    engines: with Qwen2.5-0.5B (about 2 GB of float32 weights per engine) beside the module's other
    engines, Ray's memory monitor killed a replica once on a 24 GiB machine running the whole suite."""
    from lm_eval.api.instance import Instance

    from ensemble_bench.decoding.request_sampling import SamplingPolicy
    from ensemble_bench.recipe import parse_recipe
    from ensemble_bench.run.lm import EnsembleLM, ReplicatedLM
    from ensemble_bench.run.replicas import Replicas

    specs = [{"model": model, "name": name, "chat_template": True, "backend": "vllm", "vllm": ENGINE,
              "num_cpus": 0.5} for model, name in (("smollm2-135m", "smollm-vllm"), ("smollm2-135m", "smollm-twin"))]
    recipe = parse_recipe({"name": "replicas", "members": specs, "method": "gac", "tasks": ["nq"], "data": "offline",
                           "batch_size": 2, "placement": {"kind": "ray", "replicas": 2}, "output": str(tmp_path)},
                          "r.yaml")
    settings = [{"until": ["\n\n"], "max_gen_toks": 8}, {"until": ["\n\n"], "max_gen_toks": 8, "temperature": 1.0}]
    requests = [Instance("generate_until", {}, (text, settings[k % 2]), k, ("t", k, 1))
                for k, text in enumerate(TEXTS + [t + " the" for t in TEXTS])]
    expected = EnsembleLM(Gac([smollm_vllm, smollm_twin], GacParams(), batch_size=2), "gac",
                          sampling=SamplingPolicy(3)).generate_until(requests)
    replicas = Replicas(recipe)
    try:
        replicated = ReplicatedLM(replicas, recipe.plan[-1].label, sampling=SamplingPolicy(3))
        assert replicated.generate_until(requests) == expected
        assert sum(replicated.clock.batches) == 3 and min(replicated.clock.batches) >= 1  # both replicas answered
    finally:
        replicas.close()
