# Two commands do all the set-up on a fresh machine:
#   make demo   - create/reuse .venv, install pipert, run the main job on its default
#   make test   - create/reuse .venv, install pipert with test extras, run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pipert-installed

.PHONY: demo test clean

CSRC := $(wildcard csrc/*.cpp csrc/core/*.cpp csrc/core/*.h csrc/core/*.cu)

$(STAMP): setup.py $(CSRC)
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]' --no-build-isolation
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pipert train

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests

clean:
	rm -rf $(VENV) build *.egg-info
