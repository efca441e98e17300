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
	$(PIP) install --quiet --disable-pip-version-check -e '.[train,test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	@for f in configs/seed/p4d-no-cp.yaml configs/seed/p4d-cp8.yaml configs/seed/p5-cp8-bf16.yaml configs/seed/p5-cp8-fp8.yaml; do \
		$(VENV)/bin/smlaunch validate $$f || exit $$?; echo; done
	@echo "--- a broken variant: FP8 on p4d (A100) with a context_parallel_degree that does not divide ---"
	@$(VENV)/bin/smlaunch validate configs/seed/p4d-cp8.yaml --set hyperparameters.fp8=1 \
		--set context_parallel_degree=3; test $$? -eq 2
	@echo; echo "--- the request submit would send for the p5 CP 8 FP8 run (nothing is sent) ---"
	$(VENV)/bin/smlaunch submit configs/seed/p5-cp8-fp8.yaml --dry-run

bench: $(STAMP)
	$(PY) bench/cli_startup.py

schema: $(STAMP)
	$(VENV)/bin/smlaunch schema > configs/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
