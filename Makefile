# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch that lies on disk here; other versions pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench schema clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet --disable-pip-version-check $(TORCH)
	$(PIP) install --quiet --disable-pip-version-check -e '.[train,data,test,sagemaker]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# The demo's corpus: byte-level tokens of the Python standard library's own source (no network).
DEMO_DATA := build/demo/data
STDLIB     = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')

$(DEMO_DATA)/train/train.jsonl: $(STAMP)
	$(PY) -m container.data pack --input $(STDLIB)/asyncio $(STDLIB)/collections $(STDLIB)/json \
		--output $@ --block-size 256 --max-blocks 4000 --overwrite

$(DEMO_DATA)/validation/validation.jsonl: $(STAMP)
	$(PY) -m container.data pack --input $(STDLIB)/email --output $@ --block-size 256 --max-blocks 64 --overwrite

demo: $(STAMP) $(DEMO_DATA)/train/train.jsonl $(DEMO_DATA)/validation/validation.jsonl
	$(VENV)/bin/smlaunch submit configs/local/demo.yaml --local

bench: $(STAMP)
	$(PY) bench/cli_startup.py
	$(PY) bench/local_overhead.py

schema: $(STAMP)
	$(VENV)/bin/smlaunch schema > configs/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
