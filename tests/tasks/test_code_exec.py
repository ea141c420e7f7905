"""The sandboxed pass@k runner: passing, failing, hanging and memory-hungry programs; the estimator."""

import pytest

from ensemble_bench.tasks.code_exec import Consent, estimate_pass_at_k, run_program, score_candidates


def test_programs_pass_fail_and_are_limited():
    assert run_program("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n")
    assert not run_program("def add(a, b):\n    return a * b\nassert add(2, 3) == 5\n")
    assert not run_program("import sys\nsys.exit(3)\n")
    assert not run_program("while True:\n    pass\n", timeout_s=1.0)           # time limit
    assert not run_program("x = bytearray(4 << 30)\n", memory_mb=256)           # memory limit
    assert not run_program("import os\nassert os.environ.get('HOME')\n")        # a bare environment


def test_pass_at_k_estimator_hand_checked():
    assert estimate_pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert estimate_pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert estimate_pass_at_k(3, 0, 1) == 0.0 and estimate_pass_at_k(3, 3, 2) == 1.0


def test_scoring_needs_the_opt_in(monkeypatch):
    tests = "assert square(3) == 9"
    with pytest.raises(RuntimeError, match="allow_code_execution"):
        score_candidates(tests, ["def square(x):\n    return x * x"])
    monkeypatch.setenv("ENSBENCH_ALLOW_CODE_EXECUTION", "1")  # no longer a way in: consent is passed, not global
    with pytest.raises(RuntimeError, match="allow_code_execution"):
        score_candidates(tests, ["def square(x):\n    return x * x"])
    candidates = ["def square(x):\n    return x * x", "def square(x):\n    return x + x"]
    assert score_candidates(tests, candidates, consent=Consent(run_code=True, unisolated=True)) == 0.5


def test_the_hooks_module_carries_the_runs_consent(tmp_path, monkeypatch):
    import importlib.util

    from ensemble_bench.tasks.code_exec import hooks_source

    verdicts = []
    for allowed in (False, True):
        path = tmp_path / f"hooks_{allowed}.py"
        path.write_text(hooks_source(Consent(run_code=allowed, unisolated=True)))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.pass_at_1.__name__ == "pass_at_1" and module.pass_at_k.__name__ == "pass_at_k"
        try:
            verdicts.append(module.pass_at_1(["assert f() == 1"], ["def f():\n    return 1"]))
        except RuntimeError as err:
            verdicts.append(str(err))
    assert verdicts == ["running generated code needs the recipe's allow_code_execution: true", 1.0]


# ------------------------------------------------------------------ through lm-eval's own evaluation
class AnswerKeyLM:
    """A stand-in model that answers each coding problem with the dataset's reference solution
    (or a wrong one), so the metric's verdict is known in advance."""

    def __init__(self, solutions, wrong=False):
        self.solutions, self.wrong = solutions, wrong

    def answer(self, context):
        key = max((k for k in self.solutions if k in context), key=context.rfind)  # the asked problem is last
        return "def nothing():\n    pass\n" if self.wrong else self.solutions[key]


@pytest.mark.parametrize("wrong", [False, True])
def test_mbpp_and_humaneval_pass_at_1_through_lm_eval(tmp_path, monkeypatch, wrong):
    import json

    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.offline import ensure_offline_data, write_task_configs

    benches = [get_benchmark("mbpp"), get_benchmark("humaneval")]
    root = ensure_offline_data(benches)
    mbpp = [json.loads(x) for x in (root / "google-research-datasets/mbpp/full/test.jsonl").read_text().splitlines()]
    human = [json.loads(x) for x in (root / "openai/openai_humaneval/default/test.jsonl").read_text().splitlines()]
    solutions = {d["text"]: d["code"] for d in mbpp} | {d["prompt"]: d["canonical_solution"] for d in human}
    key = AnswerKeyLM(solutions, wrong)

    class Model(LM):
        def generate_until(self, requests, disable_tqdm=False):
            return [key.answer(r.args[0]) for r in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    group = write_task_configs([(benches[0], 1), (benches[1], 0)], tmp_path, "offline",
                               consent=Consent(run_code=True, unisolated=True))
    results = simple_evaluate(model=Model(), tasks=[group], limit=4, bootstrap_iters=0, confirm_run_unsafe_code=True,
                              task_manager=TaskManager(include_path=str(tmp_path), include_defaults=True))
    expected = 0.0 if wrong else 1.0
    assert results["results"]["mbpp"]["pass_at_1,none"] == expected
    assert results["results"]["humaneval"]["pass_at_k,create_test"] == expected


def test_mbpp_pass_at_k_reads_every_sampled_program_through_lm_eval(tmp_path):
    """The pass_at_k variant: 5 programs per problem (lm-eval's repeats), 2 of them right: pass@2 is
    1 - C(3, 2) / C(5, 2) = 0.7 on every problem; fewer programs than k is one clear error."""
    import json
    from collections import Counter

    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.code_exec import scoring_hooks
    from ensemble_bench.tasks.offline import ensure_offline_data, write_task_configs

    bench = get_benchmark("mbpp", "pass_at_k")
    root = ensure_offline_data([bench])
    mbpp = [json.loads(x) for x in (root / "google-research-datasets/mbpp/full/test.jsonl").read_text().splitlines()]
    key = AnswerKeyLM({d["text"]: d["code"] for d in mbpp})
    seen: Counter = Counter()

    class Model(LM):
        def generate_until(self, requests, disable_tqdm=False):
            answers = []
            for request in requests:  # the repeats of a request come as the same request, in a row
                seen[request.args[0]] += 1
                right = seen[request.args[0]] in (2, 4)
                answers.append(key.answer(request.args[0]) if right else "def nothing():\n    pass\n")
            return answers

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    group = write_task_configs([(bench, 1)], tmp_path, "offline", consent=Consent(run_code=True, unisolated=True))
    results = simple_evaluate(model=Model(), tasks=[group], limit=3, bootstrap_iters=0, confirm_run_unsafe_code=True,
                              task_manager=TaskManager(include_path=str(tmp_path), include_defaults=True))
    assert set(seen.values()) == {5}
    assert results["results"]["mbpp_pass_at_k"]["pass_at_k,all"] == pytest.approx(0.7)
    _, pass_at_k = scoring_hooks(Consent(run_code=True, unisolated=True))
    with pytest.raises(ValueError, match="pass@2 needs at least 2 programs per problem"):
        pass_at_k(["assert True"], [["pass"]], k=[2])
