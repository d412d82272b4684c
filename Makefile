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
# Two phases, one after the other: the single-process tests on two xdist workers (worksteal: an
# idle worker takes queued tests from the busy one, so a few long tests do not form a tail), then
# the multi-process tests alone (beside a busy worker their ranks would run about 2x slower).
# Both phases always run; the target fails when either does (any non-zero pytest status,
# 5 = no tests collected included).
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=25
test: $(STAMP)
	$(PY) -m compileall -q pipert kernels
	@unit=0; multi=0; \
	$(PYTEST) -n 2 --dist worksteal tests/unit tests/kernels || unit=$$?; \
	$(PYTEST) tests/multiproc || multi=$$?; \
	echo "make test: single-process phase exit $$unit, multi-process phase exit $$multi"; \
	test $$unit -eq 0 && test $$multi -eq 0

clean:
	rm -rf $(VENV) build *.egg-info
