# One entry point per job. `make test` and `make demo` build .venv first when it is missing or older
# than pyproject.toml / this Makefile.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
# one target per script in examples/: `make space-sst2` runs examples/space_sst2.py
EXAMPLES := blimp-mrr bilinear-digits bilinear-language inseq-quickstart vit-digits space-sst2 guided-esnli ioi-circuit

.PHONY: help setup test test-tl4 test-min docs wheel-smoke demo bench bench-gpu bench-faithfulness bench-faithfulness-full bench-frontier bench-decoders bench-recipes bench-vision guided-esnli-seeds lint clean $(EXAMPLES)

# The versions of the support matrix's "tested" column (pip constraints; the README names them, a test checks)
TESTED := .ci/tested-versions.txt
$(STAMP): pyproject.toml Makefile $(TESTED)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# The local CPU build; any other torch pulls multi-GB CUDA wheels.
	$(PIP) install -c $(TESTED) torch
	$(PIP) install -c $(TESTED) -e ".[dev,captum,lens,inseq-runtime,demo,vision,space,corpus,docs]"
	# inseq pins typeguard<=2.13.3 against TransformerLens' >=4.2 and lists CUDA-11 wheels;
	# it imports neither, so take it without its dependencies (its real ones are in inseq-runtime).
	$(PIP) install --no-deps inseq==0.7.1
	touch $(STAMP)

setup: $(STAMP)

# TransformerLens 4.x (TransformerBridge only) in a second environment, for the tests that run under both
TL4 := .venv-tl4
# plus the conformance suite's bridge test and its bilinear-variant test (explained through the bridge), so every
# registered bridge family runs under TransformerLens 4 too.
# It also holds the newest torch (.ci/newest-versions.txt: 2.15, a CUDA build that runs on the CPU), under which
# the core's tests run as well (attribution core, encoders, decoders, the layers' op counts), with the trust passes
# whose fixes are in the bridge (7, 9) and the per-thread explanation mode (its torch.compile guards depend on torch).
NEWEST := .ci/newest-versions.txt
TL4_TESTS := tests/test_lens_bridge.py tests/test_lens_components.py \
	tests/test_conformance.py::test_transformer_bridge_from_hf_has_the_same_logits_and_is_explainable \
	tests/test_conformance.py::test_bilinear_variant_is_explained_exactly_on_every_path \
	tests/test_attribution_core.py tests/test_encoders.py tests/test_decoders.py tests/test_layer_op_count.py \
	tests/test_trust_adapters.py tests/test_trust_pass7.py tests/test_trust_pass9.py tests/test_explanation_threads.py
$(TL4)/.installed: pyproject.toml Makefile $(NEWEST)
	test -x $(TL4)/bin/python || $(PYTHON) -m venv $(TL4)
	PIP_CONSTRAINT=$(NEWEST) $(TL4)/bin/python -m pip --disable-pip-version-check -q install torch
	PIP_CONSTRAINT=$(NEWEST) $(TL4)/bin/python -m pip --disable-pip-version-check -q install -e ".[lens4,dev,captum]"
	$(TL4)/bin/python .ci/check_pins.py $(NEWEST)
	touch $@

test-tl4: $(TL4)/.installed
	$(TL4)/bin/python .ci/check_pins.py $(NEWEST)
	$(TL4)/bin/python -m pytest -q $(TL4_TESTS)

# The lowest versions pyproject.toml declares (.ci/min-versions.txt pins each lower bound; a test keeps them
# equal) in a third environment, where a smoke subset of the suite runs: the Captum, TransformerLens and
# sae-lens adapters (not inseq), encoders, decoders, Space Model, training, checkpoints and explain_dataset (about
# 6 minutes with the build on a warm pip cache).
MIN := .venv-min
MIN_VERSIONS := .ci/min-versions.txt
MIN_TESTS := tests/test_packaging.py tests/test_support_matrix.py tests/test_shipped_tokenizer.py \
	tests/test_attribution_core.py tests/test_encoders.py tests/test_decoders.py tests/test_space.py \
	tests/test_train.py tests/test_checkpoints.py tests/test_captum_adapter.py \
	tests/test_transformer_lens_adapter.py tests/test_sae_lens_adapter.py
$(MIN)/.installed: pyproject.toml Makefile $(MIN_VERSIONS)
	test -x $(MIN)/bin/python || $(PYTHON) -m venv $(MIN)
	$(MIN)/bin/python -m pip --disable-pip-version-check -q install -r $(MIN_VERSIONS)
	$(MIN)/bin/python -m pip --disable-pip-version-check -q install -c $(MIN_VERSIONS) -e ".[dev,captum,lens,corpus,vision,space]"
	touch $@

test-min: $(MIN)/.installed
	$(MIN)/bin/python -m pytest -q $(MIN_TESTS)

# the strict docs build, the wheel test, TransformerLens 4 and the lowest versions first, so that pytest's
# summary is the last line
test: $(STAMP) docs wheel-smoke test-tl4 test-min
	$(BIN)/python -m pytest -q tests

# the documentation site (docs/, mkdocs.yml) into build/site; strict: any warning fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict -q

# build the wheel, install it into a fresh environment (torch first, then extras, inseq the README way) and
# run one explanation per host library there (.ci/wheel_smoke.sh; about 2 minutes with pip's cache warm)
wheel-smoke: $(STAMP)
	bash .ci/wheel_smoke.sh

demo: $(STAMP)
	$(BIN)/python examples/demo_sst2.py

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_lens.py
	$(BIN)/python benchmarks/bench_bilinear.py

# B-cos / conventional speed and peak memory on a GPU, < 8 min on one H100 (docs/benchmarks.md#gpu); on a CPU:
# make bench-gpu BENCH_GPU_ARGS="--device cpu --quick"
bench-gpu: $(STAMP)
	$(BIN)/python benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)

bench-faithfulness: $(STAMP)
	$(BIN)/python benchmarks/bench_faithfulness.py

# the B frontier: accuracy vs Comp / Suff / SeqPG per B-cos setting against the best post-hoc methods, with paired
# bootstrap intervals (docs/benchmarks.md#frontier); resumable (cells cached in outputs/bench_frontier), prints its
# CPU budget first (about 6.5 CPU-hours for the default grid, an estimate until cells are measured)
bench-frontier: $(STAMP)
	$(BIN)/python benchmarks/bench_frontier.py

# B-cos fine-tuning recipes against conventional fine-tuning (docs/recipes.md; a few minutes per recipe)
bench-recipes: $(STAMP)
	$(BIN)/python benchmarks/bench_recipes.py

# B-cos ViT W(x)x against post-hoc methods on the same B-cos ViT and a conventional ViT (docs/benchmarks.md#vision)
bench-vision: $(STAMP)
	$(BIN)/python benchmarks/bench_vision.py

# trains (or reloads from outputs/bench_decoders/models) a small conventional and B-cos GPT-2 until they solve IOI
bench-decoders: $(STAMP)
	$(BIN)/python benchmarks/bench_decoders.py

# every shipped training row, 3 epochs, twice the evaluation size, Shapley sampling at Captum's 25 samples
# (not re-timed since the recipe and the Shapley batching changed; the default run costs about 12 CPU-minutes)
bench-faithfulness-full: $(STAMP)
	BENCH_TRAIN=3000 BENCH_AG_TRAIN=2400 BENCH_EPOCHS=3 BENCH_EVAL=32 BENCH_SEQPG=16 BENCH_SHAPLEY_SAMPLES=25 \
	BENCH_OUT=outputs/bench_faithfulness_full $(BIN)/python benchmarks/bench_faithfulness.py

# Examples (CPU, minutes each; outputs under outputs/)
$(EXAMPLES): $(STAMP)
	$(BIN)/python examples/$(subst -,_,$@).py

# examples/guided_esnli.py on ten seeds, two runs at a time: a base run (GUIDED_BASE, named GUIDED_BASE_TAG: vanilla,
# the supervised default and its random-mask control by default) and a candidate (GUIDED_CANDIDATE, named
# GUIDED_CANDIDATE_TAG; the ranking objective on all heads by default; empty: none), on GUIDED_EVAL evaluation
# pairs; then the paired table of the decision rule (GUIDED_CONFIDENCE: its intervals;
# docs/methods/self-guided-attention.md). At the defaults (3 epochs) about 2 hours on an idle 2-core CPU; the
# confirmation that set them (GUIDED_CANDIDATE= and GUIDED_EVAL=1605, the documented command) about 1 hour.
GUIDED_SEEDS ?= 0 1 2 3 4 5 6 7 8 9
GUIDED_BASE ?= --variants vanilla,supervised,supervised-random
GUIDED_BASE_TAG ?= default
GUIDED_CANDIDATE ?= --variants supervised --supervision-objective rank --supervision-heads 0
GUIDED_CANDIDATE_TAG ?= rank12
GUIDED_EVAL ?= 400
GUIDED_CONFIDENCE ?= 0.975
GUIDED_OUT ?= outputs/guided_esnli/seeds
GUIDED_RUN := $(BIN)/python examples/guided_esnli.py --threads 1 --family stock --no-posthoc --eval $(GUIDED_EVAL)
guided-esnli-seeds: $(STAMP)
	mkdir -p $(GUIDED_OUT)
	printf '%s\n' $(GUIDED_SEEDS) | xargs -P 2 -I{} sh -c '\
	  $(GUIDED_RUN) $(GUIDED_BASE) --seed {} --out $(GUIDED_OUT)/$(GUIDED_BASE_TAG)_seed{}.json \
	    > $(GUIDED_OUT)/log_$(GUIDED_BASE_TAG)_seed{}.txt 2>&1 && \
	  $(if $(GUIDED_CANDIDATE),$(GUIDED_RUN) $(GUIDED_CANDIDATE) --seed {} --out $(GUIDED_OUT)/$(GUIDED_CANDIDATE_TAG)_seed{}.json \
	    > $(GUIDED_OUT)/log_$(GUIDED_CANDIDATE_TAG)_seed{}.txt 2>&1,true)'
	$(BIN)/python examples/guided_esnli.py --report $(GUIDED_OUT)/$(GUIDED_BASE_TAG)_seed*.json \
	  $(if $(GUIDED_CANDIDATE),$(GUIDED_OUT)/$(GUIDED_CANDIDATE_TAG)_seed*.json) --confidence $(GUIDED_CONFIDENCE)

# every target in one line each (tests/test_trust_pass23_newcomer.py keeps it equal to the rules of this file); a bare
# `make` still builds .venv (setup)
help:
	@echo "make setup          build .venv: torch 2.13 CPU, the package editable with every extra, inseq the recipe way"
	@echo "make demo           B-cosify MiniLM, fine-tune it on SST-2 and explain it (offline, minutes on a CPU)"
	@echo "make test           the whole suite, the strict docs build, the wheel test, test-tl4 and test-min (what CI runs)"
	@echo "make test-tl4       the bridge and core tests under TransformerLens 4 and the newest torch (.venv-tl4)"
	@echo "make test-min       a smoke subset on the lowest declared versions (.venv-min)"
	@echo "make docs           the documentation site, strict, into build/site"
	@echo "make wheel-smoke    build the wheel, install it fresh, run one explanation per host library"
	@echo "make lint           ruff over the package, adapters, tests, examples, benchmarks, .ci and docs"
	@echo "make clean          remove .venv, .venv-tl4, .venv-min, build and the egg-info"
	@echo "make bench          speed ratios: core, TransformerLens, bilinear (docs/benchmarks.md)"
	@echo "make bench-gpu      B-cos / conventional speed and memory on a GPU (BENCH_GPU_ARGS=\"--device cpu --quick\")"
	@echo "make bench-faithfulness       faithfulness against Captum's methods on fine-tuned B-cos models (minutes)"
	@echo "make bench-faithfulness-full  the same, every training row, 3 epochs"
	@echo "make bench-frontier           accuracy vs faithfulness per B (resumable, CPU-hours)"
	@echo "make bench-recipes            B-cos fine-tuning recipes against conventional fine-tuning"
	@echo "make bench-vision             B-cos ViT against post-hoc methods"
	@echo "make bench-decoders           small GPT-2s trained until they solve IOI"
	@echo "make guided-esnli-seeds       Self-Guided Attention on ten seeds, then the paired table (hours)"
	@echo "examples (one per script in examples/, CPU minutes each): $(EXAMPLES)"

lint: $(STAMP)
	$(BIN)/ruff check bcos_plugins adapters tests examples benchmarks .ci docs

clean:
	rm -rf $(VENV) $(TL4) $(MIN) build *.egg-info .pytest_cache
