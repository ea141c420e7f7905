"""scripts/bench_speculative.py: its arguments, prompts, tables, and the CI guard's verdict (tiny models only)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_speculative.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_speculative", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def tiny_members(pair):
    return pair("bpe", "sp")


def test_defaults_cover_every_pair_task_and_batch_size(bench):
    args = bench.parse_args([])
    assert args.pairs == ["smollm2+qwen2.5", "smollm2+gemma3", "gemma3+qwen2.5", "stress"]
    assert (args.tasks, args.batch_sizes, args.methods) == (["gsm8k", "nq"], [1, 8], ["gac", "unite", "safe"])
    assert args.proposer is None and str(args.out) == "results/bench/speculative.json"


@pytest.mark.parametrize(("text", "value"), [("null", None), ("auto", "auto"), ("1", 1), ("qwen2.5", "qwen2.5")])
def test_proposer_is_null_auto_an_index_or_a_label(bench, text, value):
    assert bench.parse_args(["--proposer", text]).proposer == value
    assert bench.speculative_params(bench.parse_args(["--proposer", text, "--draft", "5"])) == (
        {"speculative": 5} if value is None else {"speculative": 5, "proposer": value})


@pytest.mark.parametrize("argv", [["--pairs", "llama+mistral"], ["--limit", "0"], ["--draft", "-1"],
                                  ["--max-new-tokens", "0"]])
def test_a_bad_argument_is_one_line_and_exit_2(bench, capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("bench_speculative: ")


def test_prompts_follow_lm_evals_templates(bench):
    shots = [{"question": f"q{i}", "answer": f"w{i}\n#### {i}"} for i in range(5)]
    gsm8k = bench.gsm8k_prompt(shots, "How many?")
    assert gsm8k.startswith("Question: q0\nAnswer: w0\n#### 0\n\nQuestion: q1")
    assert gsm8k.endswith("#### 4\n\nQuestion: How many?\nAnswer:") and gsm8k.count("Question:") == 6
    nq = bench.nq_prompt([{"question": "who", "answer": ["me", "you"]}], "when")
    assert nq == "Answer these questions:\n\nQ: who?\nA: me\nQ: when?\nA:"


def test_gsm8k_prompts_never_show_their_own_question(bench, offline_data):
    prompts = bench.task_prompts("gsm8k", 3)
    assert len(prompts) == 3 and len(set(prompts)) == 3
    for prompt in prompts:
        question = prompt.rsplit("Question: ", 1)[1]
        assert prompt.count(question) == 1 and prompt.count("Question:") == 6


def run(ms: float, texts: list[str], **figures) -> dict:
    return {"ms_per_token": ms, "wall_s": 1.0, "tokens": 10, "texts": texts, **figures}


def test_compared_counts_byte_identical_outputs_and_keeps_each_difference(bench):
    result = bench.compared(run(100.0, ["a", "b", "c"]), run(60.0, ["a", "b!", "c"]), ["p0", "p1", "p2"])
    assert result["ratio"] == pytest.approx(0.6)
    assert (result["identical"], result["total"]) == (2, 3)
    assert result["differences"] == [{"prompt": 1, "every_token": "b", "speculative": "b!"}]


def test_the_table_shows_ratio_acceptance_identical_and_bounds(bench):
    fast = run(60.0, ["a", "b"], speculative_acceptance_rate=0.75, speculative_tokens_per_round=3.0,
               speculative_forwards_per_token={"smollm2": 1.25, "qwen2.5": 0.33})
    row = {"pair": "smollm2+qwen2.5", "task": "gsm8k", "batch": 1, "draft": 8,
           "members": {"smollm2": run(40.0, []), "qwen2.5": run(90.0, [])},
           "methods": {"gac": bench.compared(run(100.0, ["a", "b"]), fast, ["p0", "p1"]),
                       "safe": {"run": run(44.0, []), "drafter": "smollm2", "ratio": 1.1}},
           "bounds": {"qwen2.5": {"step_ms": 80.0, "block_ms": 120.0, "block_over_step": 1.5}}}
    lines = bench.table([row]).splitlines()
    assert ("| smollm2+qwen2.5 | gsm8k | 1 | gac | 100.0 | 60.0 | 0.60x | 0.75 | 3.00 | smollm2 1.25, qwen2.5 0.33 "
            "| 2/2 |") in lines
    assert "| smollm2+qwen2.5 | gsm8k | 1 | safe (vs smollm2 alone) | 40.0 | 44.0 | 1.10x |  |  |  |  |" in lines
    assert "| smollm2+qwen2.5 | gsm8k | 1 | qwen2.5 alone | 90.0 |  |  |  |  |  |  |" in lines
    assert "| smollm2+qwen2.5 | gsm8k | 1 | qwen2.5 | 90.0 | 80.0 | 120.0 | 1.50x | gac 0.75 |" in lines
    assert any("block of 8 ms" in line for line in lines)


def test_the_check_passes_when_speculative_gac_equals_every_token(bench, tiny_members):
    failure, accepted = bench.run_check(tiny_members, bench.PROMPTS[:3], draft=4, tokens=8, batch_sizes=(1, 2))
    assert failure is None
    assert len(accepted) == 4 and any(accepted)  # drafts were accepted: the outputs compared are speculation's


def test_the_check_fails_in_one_line_naming_the_first_differing_prompt(bench, tiny_members, monkeypatch):
    honest = bench.outputs

    def one_changed(method, requests):
        texts = honest(method, requests)
        return [t + "!" if i == 1 and method.params.speculative else t for i, t in enumerate(texts)]

    monkeypatch.setattr(bench, "outputs", one_changed)
    monkeypatch.setattr(bench.Members, "pair", lambda self, pair: tiny_members)
    monkeypatch.setattr(bench, "CHECK_TOKENS", 6)
    monkeypatch.setattr(sys, "argv", ["bench_speculative.py"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--check", "--threads", "1"])
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message  # sys.exit(text): that line on stderr, status 1
    assert message.startswith("bench-speculative-check: speculative gac (draft 8, batch 1) differs")
    assert f"prompt 1 {bench.PROMPTS[1]!r}" in message
