# The two set-up commands: `make train` (the main job) and `make test` (the test suite).
# Each creates .venv on first use: `make train` installs the project with what training needs,
# `make test` adds the test and lint tools (the [dev] extra). A stamp file per install redoes it
# when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: train lint system-deps slurm-up slurm-down test test-fast test-slow test-gpu gpu-check ui bottleneck bottleneck-transformer bottleneck-local reverse-alignment joey-reverse messages-corpus messages-results bench docker-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@echo "Installing attnseq and what it needs to train into $(VENV)/ (the first install takes a few minutes) ..."
	$(PIP_INSTALL) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	@echo "Installing the test and lint tools (attnseq[dev]) into $(VENV)/ ..."
	$(PIP_INSTALL) -e '.[dev]'
	touch $(DEV_STAMP)

train: $(STAMP)  ## the main job; pass Hydra overrides as ARGS="scorer=dot model.heads=2"
	$(PY) train.py $(ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check attnseq hydra_plugins tests benchmarks scripts/slurm_cluster.py train.py evaluate.py translate.py build_corpus.py

system-deps:  ## Debian packages the tests need (PostgreSQL server, chromium, Slurm and munge); a no-op once installed
	scripts/install-system-deps

SLURM_DIR ?= .slurm
slurm-up: system-deps  ## a one-node Slurm cluster on this machine, everything in $(SLURM_DIR)/ (root, no systemd); prints what to export
	@$(PYTHON) scripts/slurm_cluster.py up $(SLURM_DIR)

slurm-down:  ## stop it: cancels its jobs, stops munged, slurmctld and slurmd, checks nothing of it is left running
	@$(PYTHON) scripts/slurm_cluster.py down $(SLURM_DIR)

# workers for `make test`: more than the cores, since many end-to-end tests wait on servers, signals and timeouts
TEST_WORKERS ?= 3

test: $(DEV_STAMP) lint system-deps  ## what CI runs: lint, every test that needs no GPU (slow ones, the image build among them) on $(TEST_WORKERS) workers; lists the 25 slowest
	$(PY) -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

test-fast: $(DEV_STAMP)  ## the quick loop: slow and GPU tests deselected
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: $(DEV_STAMP) system-deps  ## only the tests marked slow
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-gpu: $(DEV_STAMP)  ## only the tests that need a CUDA device
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

gpu-check: $(STAMP)  ## on a CUDA machine: every scorer × decoder in fp32 and bf16 (tolerances), the kernels taken, tok/s, one train.py trainer=gpu into MLflow; exits 2 without CUDA (GPU_CHECK_ARGS=--dry-run: the same on CPU)
	$(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

bottleneck: $(STAMP)  ## no attention vs every scorer in conf/scorer/, 3 seeds each (2 trainings at a time), evaluation to length 80, comparison with 95% intervals
	$(PY) train.py -m experiment=bottleneck
	$(PY) evaluate.py parent_run_id=latest experiment_name=bottleneck eval.lengths=[1,80] eval.bucket_width=10

bottleneck-transformer: $(STAMP)  ## the bottleneck's extra rows: a self-attention encoder (none, additive, general, multihead; 3 seeds), then the Transformer encoder-decoder (3 seeds)
	$(PY) train.py -m experiment=bottleneck_transformer
	$(PY) evaluate.py parent_run_id=latest experiment_name=bottleneck eval.lengths=[1,80] eval.bucket_width=10
	$(PY) train.py -m experiment=bottleneck_transformer decoder=transformer scorer=multihead
	$(PY) evaluate.py parent_run_id=latest experiment_name=bottleneck eval.lengths=[1,80] eval.bucket_width=10

bottleneck-local: $(STAMP)  ## the bottleneck's local-attention rows: Luong's local-p and local-m with the general score (D = 10; 3 seeds)
	$(PY) train.py -m experiment=bottleneck_local
	$(PY) evaluate.py parent_run_id=latest experiment_name=bottleneck eval.lengths=[1,80] eval.bucket_width=10

reverse-alignment: $(STAMP)  ## additive attention on reverse (GRU, biGRU × both conventions): where it looks vs what it uses
	$(PY) train.py -m experiment=reverse_alignment
	$(PY) evaluate.py parent_run_id=latest experiment_name=reverse_alignment

joey-reverse: $(STAMP)  ## JoeyNMT's reverse tutorial (biLSTM + LSTM, Luong general) and a Transformer on the same data; test BLEU greedy and beam 5
	$(PY) train.py experiment=joey_reverse threads=2
	$(PY) train.py experiment=joey_reverse threads=2 encoder=transformer decoder=transformer scorer=multihead model.heads=4 model.embedding_dim=64
	$(PY) evaluate.py experiment_name=joey_reverse eval.lengths=[1,30] eval.size=1000 eval.seed=0
	$(PY) evaluate.py experiment_name=joey_reverse eval.lengths=[1,30] eval.size=1000 eval.seed=0 eval.beam_size=5 eval.n_best=5

messages-corpus: $(STAMP)  ## English → French pairs from the installed gettext catalogs → data/messages_en-fr/ (ARGS="--lang de" for another language)
	$(PY) build_corpus.py $(ARGS)

messages-results: $(STAMP)  ## docs/experiments.md's real-text table: messages corpus en→fr, no attention / additive / general / multihead / transformer encoder (~25 min on 2 cores)
	$(PY) build_corpus.py --lang fr
	$(PY) train.py -m experiment=messages_en_fr scorer=none,additive,general hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1 trainer.enable_progress_bar=false
	$(PY) train.py -m experiment=messages_en_fr encoder=bigru,transformer scorer=multihead model.heads=4 hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1 trainer.enable_progress_bar=false
	$(PY) evaluate.py experiment_name=messages_en_fr eval.lengths=[1,40] 'eval.sentences=["invalid register name","Maximum size"]'

bench: $(STAMP)  ## the full benchmark: training, decoding, what users wait on, JoeyNMT and OpenNMT-py beside attnseq (1–2 h on 2 cores: 58 min on the AMD EPYC, 128 min on the Intel Xeon) → benchmarks/results.md
	$(PY) benchmarks/bench.py $(ARGS)

# STORE: a store URI (sqlite:///…, postgresql://…) or a path to an SQLite file; a relative one is made
# absolute from here. MLflow's server app in one process (attnseq.tracking.ui_server: one worker, no job
# runner; `mlflow server` would import it twice, in its command line and in the uvicorn process it starts):
# a server for one user, on a laptop.
STORE ?= sqlite:///mlflow.db
PORT ?= 5000
STORE_URI = $(if $(findstring ://,$(STORE)),$(if $(filter sqlite:///%,$(STORE)),sqlite:///$(abspath $(patsubst sqlite:///%,%,$(STORE))),$(STORE)),sqlite:///$(abspath $(STORE)))
ui: $(STAMP)  ## the MLflow UI on STORE (default: this folder's mlflow.db) at http://127.0.0.1:$(PORT)
	@$(PY) -m attnseq.tracking.ui_server --backend-store-uri $(STORE_URI) --host 127.0.0.1 --port $(PORT)

docker-check:  ## build docker/Dockerfile with buildah and train inside it (root; ~4 min cold, ~25 s warm)
	scripts/docker-check

clean:
	rm -rf $(VENV) outputs multirun mlruns mlartifacts mlflow.db .pytest_cache
