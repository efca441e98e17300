# The README's two commands: `make demo` and `make test`.
# Both install from the locks committed in requirements/ (every package at one version, with its
# hashes), so a fresh machine gets what was tested, not the day's releases. `make lock` refreshes
# them (the newest releases that fit) after pyproject.toml or requirements/sdk3-*.in change, or
# to take new releases; commit the result.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch that lies on disk here; other versions pull a multi-GB CUDA build. pip
# installs it (pip's configuration finds it) and the lock leaves it out.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
LOCK   := requirements/lock.txt
LOCK_EXTRAS := train data test sagemaker plot wandb mlflow qlora
# uv installs a lock in seconds where pip's resolver took minutes. It reads no pip.conf, so
# scripts/uv-pip.py runs `uv pip` with pip's find-links, indexes, constraints and cert; its --pip
# runs pip without the "Location '...' is ignored" warning it prints per package here.
UV_VERSION := 0.13.8
UV     := $(VENV)/bin/uv
UV_PIP := $(PY) scripts/uv-pip.py
QUIET_PIP := $(PY) scripts/uv-pip.py --pip

.PHONY: demo test unit check durations lint install image bench schema clean lock

$(PY):
	$(PYTHON) -m venv $(VENV)

# Python writes the bytecode of what it imports, whatever the caller's PYTHONDONTWRITEBYTECODE (the
# install, below, and the test targets); what a job's processes import, compiled at install
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE
BYTECODE_WARMUP := import container.distributed.forked_ranks, container.toolkit.bootstrap, launcher.cli.app, \
	launcher.local.supervise

$(UV): | $(PY)
	$(QUIET_PIP) install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# torch first, by uv with pip's configuration (scripts/uv-pip.py: its find-links, where the CPU
# wheel lies, and its constraint), with its few dependencies, whose versions the lock then sets;
# then the lock exactly as written: --no-deps (nothing resolved), every hash checked; then smlaunch
# itself, editable. Where PYTHONDONTWRITEBYTECODE is set (this machine, CI), Python never writes
# bytecode itself: every process compiles again what has none (`import torch, transformers`: 4.9 s
# without, 2.7 s with; a fresh clone's suite took 1,019 s of pytest where a compiled venv took 744
# s), so the install leaves bytecode for what smlaunch's own processes import: torch and its
# dependencies installed with it (sympy, networkx, ...: --compile-bytecode, in parallel), then what
# the runtime and the CLI import from the lock and smlaunch itself (WARMED, below: BYTECODE_WARMUP's
# imports, written once). The lock's other modules get theirs from the first test process that imports them
# (the test targets' WRITE_BYTECODE): a whole suite imports a third of the venv's 26,900 modules
# (transformers 186 of 2,912, kubernetes 309 of 1,933, moto 112 of 1,458), and compiling the whole
# lock took 20 s of a 35 s install (2026-11-30). The check fails the install where pyproject.toml
# asks for what the lock lacks.
$(STAMP): $(PY) pyproject.toml $(LOCK) | $(UV)
	$(UV_PIP) install --quiet --compile-bytecode $(TORCH)
	$(UV_PIP) install --quiet --no-deps --require-hashes -r $(LOCK)
	$(UV_PIP) install --quiet --no-deps -e .
	$(PY) -m compileall -q -j 0 launcher container
	@$(UV_PIP) --check smlaunch $(LOCK_EXTRAS) || { echo "$(LOCK) is out of date: make lock" >&2; exit 1; }
	touch $(STAMP)

# The bytecode of what smlaunch's own processes import (BYTECODE_WARMUP), a target of its own: one
# process on one core for ~3 s, which `make test` runs beside the rest of what the suite needs
# (TEST_PRELUDE) rather than before it. Every target that runs smlaunch's processes asks for it.
WARMED := $(VENV)/.bytecode
$(WARMED): $(STAMP)
	$(WRITE_BYTECODE) $(PY) -c '$(BYTECODE_WARMUP)'
	touch $@

# The SageMaker SDK v3 (sagemaker-train on sagemaker-core 2.x): tests/integration/test_model_trainer_parity.py's
# reference. Both SDKs are the `sagemaker` package, so v3 gets a venv of its own, without the
# dependencies ModelTrainer never imports (mlflow, scipy, ...): its lock holds the SDK
# (requirements/sdk3-pins.in) without them and what ModelTrainer imports (sdk3-deps.in) with
# theirs, and is installed with --no-deps (pip check there lists what is left out on purpose), without
# bytecode: only those tests run it, and they write what they import (WRITE_BYTECODE; the install 8.2
# -> 3.6 s, 2026-11-30). The venv has no pip of its own (uv installs into it): ensurepip took 3.2 s of
# its 3.9 s.
SDK3_VENV  ?= .venv-sdk3
SDK3_STAMP := $(SDK3_VENV)/.installed
SDK3_LOCK  := requirements/sdk3-lock.txt

$(SDK3_STAMP): $(SDK3_LOCK) | $(UV)
	$(PYTHON) -m venv --without-pip $(SDK3_VENV)
	$(UV_PIP) install --quiet --no-deps --require-hashes --python $(SDK3_VENV)/bin/python -r $(SDK3_LOCK)
	touch $@

# The HyperPodPyTorchJob's published models (requirements/hyperpod-ref.txt): sagemaker-hyperpod's
# wheel alone (--no-deps), unpacked into a directory that tests/support/hyperpod_reference.py loads
# the one pydantic module from, by its path, with this venv's pydantic.
HYPERPOD_REF   ?= build/hyperpod-ref
HYPERPOD_STAMP := $(HYPERPOD_REF)/.installed

$(HYPERPOD_STAMP): requirements/hyperpod-ref.txt | $(UV)
	rm -rf $(HYPERPOD_REF)
	$(UV_PIP) install --quiet --no-deps --require-hashes --no-compile --target $(HYPERPOD_REF) \
		-r requirements/hyperpod-ref.txt
	touch $@

# The locks, for Python 3.11 on x86_64 Linux with glibc >= 2.28 (the CPU torch wheel's platform,
# and the image's) whatever machine runs `make lock`. torch is pinned to TORCH for the resolution
# and left out of the file; a CUDA package in it means torch resolved to a CUDA build (give pip
# the CPU wheel, or run UV_TORCH_BACKEND=cpu make lock). The SDK v3's lock is two resolutions:
# the SDK alone (--no-deps), then what ModelTrainer imports. --upgrade: resolved afresh each time,
# as uv, preferring a lock's pins, takes an older release where an index holds the pinned one
# only for another platform (here: the local index's manylinux_2_34 wheels).
LOCK_FLAGS := --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --upgrade

lock: | $(UV)
	@mkdir -p build/lock && echo '$(TORCH)' > build/lock/torch.txt
	$(UV_PIP) compile $(LOCK_FLAGS) --custom-compile-command 'make lock' pyproject.toml \
		$(LOCK_EXTRAS:%=--extra %) -c build/lock/torch.txt --no-emit-package torch -o $(LOCK)
	@! grep -iE '^(nvidia-|triton|cuda-)' $(LOCK) \
		|| { echo "$(LOCK) names CUDA packages: torch resolved to a CUDA build" >&2; exit 1; }
	$(UV_PIP) compile $(LOCK_FLAGS) --no-header --no-deps requirements/sdk3-pins.in -o build/lock/sdk3-pins.txt
	$(UV_PIP) compile $(LOCK_FLAGS) --no-header requirements/sdk3-deps.in -o build/lock/sdk3-deps.txt
	{ printf '%s\n' '# The SDK v3 reference venv (.venv-sdk3), installed with --no-deps. Written by `make lock`' \
		'# from requirements/sdk3-pins.in (without dependencies) and requirements/sdk3-deps.in.'; \
		cat build/lock/sdk3-pins.txt build/lock/sdk3-deps.txt; } > $(SDK3_LOCK)

install: $(WARMED) $(SDK3_STAMP) $(HYPERPOD_STAMP)

# The training image (container/Dockerfile), built by podman or Docker from local material: a
# Debian base from Debian's packages with this venv's wheels, nothing pulled from a registry
# (scripts/build-image.sh). BASE_IMAGE=<image> builds on that image instead (an AWS DLC).
IMAGE      ?= smlaunch:latest
BASE_IMAGE ?=
TEST_IMAGE := smlaunch:test

image: $(STAMP)
	@scripts/install-podman.sh
	scripts/build-image.sh --tag $(IMAGE) $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))

# The docker runner's real-engine tests run against TEST_IMAGE; they skip (saying why) only
# where no engine could be installed. A failed image build fails the target.
# Three workers on two cores: the suite's jobs wait as well as compute (a failed host's peers' grace,
# SIGTERM's, a hang's timeout, containers and Slurm steps starting), and a third worker fills those
# waits: the same suite took 1,004 s of pytest on 2 workers and 948 s on 3 (2026-11-30, BENCHMARKS.md,
# the machine idle 3% of the latter). The unit tests only compute: `make unit` and `make check` keep 2.
TEST_WORKERS ?= 3
test: $(STAMP)
	@scripts/install-slurm.sh
	@scripts/install-podman.sh
	@$(MAKE) --no-print-directory -j 3 $(TEST_PRELUDE)
	$(VENV)/bin/ruff check .
	@# --durations-file=PATH as one word: pytest reads its arguments before tests/conftest.py adds the
	@# option, and took a PATH that exists (a second `make test`) for the tests to run (so it never
	@# loaded tests/conftest.py, whose plugin adds the option: "unrecognized arguments")
	@# The BESIDE step (below) runs beside the suite at the lowest priority (scripts/lowest-priority.sh: nice 19
	@# for its session's scheduling group too, without which it took half the cores while the suite's workers
	@# collected): it takes the cores' moments the suite's jobs leave idle while they wait, not the suite's time,
	@# and its report follows the suite's. Either failing fails the target; an interrupted or failed suite ends
	@# it (its process group).
	@mkdir -p build; $(BESIDE_RUN) >$(BESIDE_LOG) 2>&1 & beside=$$!; \
	trap 'kill -- -$$beside 2>/dev/null' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	echo '$(SUITE_RUN)'; $(SUITE_RUN) || exit $$?; \
	echo '$(BESIDE_RUN) (beside the suite):'; wait $$beside; status=$$?; trap - EXIT; \
	cat $(BESIDE_LOG); exit $$status
# What the suite needs besides the venv, made side by side (each keeps about one core busy for a few
# seconds): the bytecode warm-up, the SDK v3 and HyperPod reference venvs and the test image; 7 s where they took 11 s one after
# the other (2026-11-30, BENCHMARKS.md). A collection of the tests made here first, so that the workers'
# three collections found the bytecode of what the test modules import, cost as much as it saved.
TEST_PRELUDE := $(WARMED) $(SDK3_STAMP) $(HYPERPOD_STAMP) test-image

.PHONY: test-image
test-image: $(STAMP)
	@mkdir -p build/image && scripts/build-image.sh --if-engine --tag $(TEST_IMAGE) >build/image/test-build.log 2>&1 \
		|| { tail -n 40 build/image/test-build.log; exit 1; }; tail -n 1 build/image/test-build.log

SUITE_RUN = $(WRITE_BYTECODE) SMLAUNCH_DOCKER_IMAGE=$(TEST_IMAGE) SMLAUNCH_FUZZ_SHARE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) \
	--dist loadfile --durations=25 --durations-file=$(DURATIONS) $(UNBOUNDED:%=--ignore=%)
BESIDE_RUN = $(WRITE_BYTECODE) MKL_CBWR=COMPATIBLE setsid scripts/lowest-priority.sh $(PY) -m pytest -q -n 2 --dist loadfile \
	$(NUMERICS) $(UNBOUNDED)
BESIDE_LOG := build/beside.log

# The tests that compare two code paths' floating-point results, once more on MKL's COMPATIBLE code
# path (other kernels and blocking than this CPU's own): a comparison that holds only where both
# paths happen to round alike fails here rather than on the next user's machine (a one-token
# attention window's gradient compared relative to itself, 0/0 here; a padded head's logits
# compared bitwise). ATEN_CPU_CAPABILITY=default or avx2 and one thread caught neither. ~20 CPU s,
# which `make test` runs beside the suite (2026-11-30: 14 s of wall after it before).
NUMERICS := tests/unit/test_close.py tests/unit/test_vocab_padding.py tests/unit/test_loss.py \
	tests/unit/test_document_masking.py tests/unit/test_document_kernels.py tests/unit/test_context_parallel.py \
	tests/unit/test_moe.py tests/unit/test_model_types.py tests/integration/test_context_parallel.py
# Modules that only compute, with no bound on their wall time (no process timeout, no deadline: at the
# lowest priority they wait while the suite is busy), which run beside the suite instead of in it:
# the traced planner's (fake tensors, where MKL's code path changes nothing). They fill the cores'
# idle moments (~50 CPU s of a suite's, mid-run: BENCHMARKS.md) instead of taking the suite's.
UNBOUNDED := tests/integration/test_plan_memory_trace.py tests/integration/test_plan_trace.py

# The inner loop: tests/unit starts no process and opens no socket (its conftest refuses both),
# and runs in under 2 minutes: a tenth of the CLI fuzz's examples (SMLAUNCH_FUZZ_SHARE; make test runs
# them all). tests/integration and tests/e2e run in `make test`.
unit: $(WARMED)
	$(WRITE_BYTECODE) SMLAUNCH_FUZZ_SHARE=0.1 $(PY) -m pytest -q -n 2 --dist loadfile tests/unit

# The everyday loop: the unit tests and the integration and e2e modules that differ from main
# (scripts/changed-tests.sh: this branch's commits, the work tree, new files; CHECK_BASE=<ref> compares
# with another), under 5 minutes where few changed. `make test` and CI run everything.
CHECK_BASE ?=
check: $(WARMED) $(SDK3_STAMP) $(HYPERPOD_STAMP)
	@changed=$$(scripts/changed-tests.sh $(CHECK_BASE)) || exit $$?; \
		echo "make check: tests/unit $${changed:-(no integration or e2e module changed)}" | tr '\n' ' '; echo; \
		$(WRITE_BYTECODE) SMLAUNCH_FUZZ_SHARE=0.1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=10 tests/unit \
		$$changed

# Each module's seconds as the last `make test` measured them (its --durations-file), kept in the
# repository: the scheduler (tests/conftest.py) starts the longest modules first. Run after a green
# `make test` where modules were added or their costs changed, and commit tests/durations.json.
DURATIONS := build/test-durations.json
durations:
	@test -f $(DURATIONS) || { echo "$(DURATIONS) is missing: run make test first" >&2; exit 1; }
	cp $(DURATIONS) tests/durations.json

# The rules are pyproject.toml's [tool.ruff]; `make test` runs this too, so CI enforces it.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The demo's corpus: byte-level tokens of the Python standard library's own source (no network).
DEMO_DATA := build/demo/data
STDLIB     = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')

$(DEMO_DATA)/train/train.jsonl: $(STAMP)
	$(PY) -m container.data pack --input $(STDLIB)/asyncio $(STDLIB)/collections $(STDLIB)/json \
		--output $@ --block-size 256 --max-blocks 4000 --overwrite

$(DEMO_DATA)/validation/validation.jsonl: $(STAMP)
	$(PY) -m container.data pack --input $(STDLIB)/email --output $@ --block-size 256 --max-blocks 64 --overwrite

# RUNNER=docker: the same job with each host in a container of IMAGE (built first).
RUNNER ?= process

demo: $(WARMED) $(DEMO_DATA)/train/train.jsonl $(DEMO_DATA)/validation/validation.jsonl $(if $(filter docker,$(RUNNER)),image)
	$(VENV)/bin/smlaunch submit configs/local/demo.yaml --local --runner $(RUNNER) \
		$(if $(filter docker,$(RUNNER)),--set image_uri=$(IMAGE))

bench: $(WARMED)
	$(PY) bench/cli_startup.py
	$(PY) bench/local_overhead.py

schema: $(WARMED)
	$(VENV)/bin/smlaunch schema > configs/schema.json

clean:
	rm -rf $(VENV) $(SDK3_VENV) .pytest_cache .hypothesis *.egg-info
