# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch that lies on disk here; other versions pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test install image bench schema clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet --disable-pip-version-check $(TORCH)
	$(PIP) install --quiet --disable-pip-version-check -e '.[train,data,test,sagemaker]'
	touch $(STAMP)

# The SageMaker SDK v3 (sagemaker-train on sagemaker-core 2.x): tests/test_model_trainer_parity.py's
# reference. Both SDKs are the `sagemaker` package, so v3 gets a venv of its own, without the
# dependencies ModelTrainer never imports (mlflow, scipy, ...).
SDK3_VENV  ?= .venv-sdk3
SDK3_STAMP := $(SDK3_VENV)/.installed
SDK3_PINS  := sagemaker-core==2.27.0 sagemaker-train==1.27.0
SDK3_DEPS  := 'boto3>=1.43.90,<2' 'pydantic>=2,<3' 'PyYAML>=6,<7' 'graphene>=3,<4' 'rich>=13,<15' \
	'importlib-metadata>=1.4,<7' 'requests>=2.20,<3' 'attrs>=20.3' 'jsonschema<5' 'platformdirs>=4,<5' \
	'numpy>=1.9' 'pandas>=1' 'omegaconf>=2.1' 'packaging>=20'

$(SDK3_STAMP):
	$(PYTHON) -m venv $(SDK3_VENV)
	$(SDK3_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps $(SDK3_PINS)
	$(SDK3_VENV)/bin/python -m pip install --quiet --disable-pip-version-check $(SDK3_DEPS)
	touch $@

install: $(STAMP) $(SDK3_STAMP)

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
test: $(STAMP) $(SDK3_STAMP)
	@scripts/install-slurm.sh
	@scripts/install-podman.sh
	@mkdir -p build/image && scripts/build-image.sh --if-engine --tag $(TEST_IMAGE) >build/image/test-build.log 2>&1 \
		|| { tail -n 40 build/image/test-build.log; exit 1; }; tail -n 1 build/image/test-build.log
	SMLAUNCH_DOCKER_IMAGE=$(TEST_IMAGE) $(PY) -m pytest -q

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

demo: $(STAMP) $(DEMO_DATA)/train/train.jsonl $(DEMO_DATA)/validation/validation.jsonl $(if $(filter docker,$(RUNNER)),image)
	$(VENV)/bin/smlaunch submit configs/local/demo.yaml --local --runner $(RUNNER) \
		$(if $(filter docker,$(RUNNER)),--set image_uri=$(IMAGE))

bench: $(STAMP)
	$(PY) bench/cli_startup.py
	$(PY) bench/local_overhead.py

schema: $(STAMP)
	$(VENV)/bin/smlaunch schema > configs/schema.json

clean:
	rm -rf $(VENV) $(SDK3_VENV) .pytest_cache .hypothesis *.egg-info
