# Two commands do all the set-up on a fresh machine:
#   make demo   - create/reuse .venv, install pipert, run the main job on its default
#   make test   - create/reuse .venv, install pipert with test extras, run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pipert-installed

.PHONY: demo test clean

CSRC := $(wildcard csrc/*.cpp csrc/core/*.cpp csrc/core/*.h csrc/core/*.cu csrc/simc/*.c)

$(STAMP): setup.py $(CSRC)
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]' --no-build-isolation
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pipert train

# pipert's bytecode is compiled once up front: the tests start a few hundred Python processes,
# each of which would otherwise compile pipert from source where PYTHONDONTWRITEBYTECODE is set.
test: $(STAMP)
	$(PY) -m compileall -q pipert kernels
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

clean:
	rm -rf $(VENV) build *.egg-info
