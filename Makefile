PYTHON ?= python3

.PHONY: install test lint bench demo autogen

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test: install
	SPEC=1 $(PYTHON) -m pytest tests

lint: install
	$(PYTHON) -m ruff check rawgrad tests tools

bench: install
	@for f in tools/bench/*.py; do echo "== $$f"; $(PYTHON) $$f || true; done

demo:
	$(PYTHON) -m pip install -q -e '.[demo]'
	$(PYTHON) tools/demo.py

# Regenerates rawgrad/autogen/ from the real C headers; see the top of tools/autogen.py for where they come from.
autogen:
	$(PYTHON) -m pip install -q -e '.[autogen]'
	$(PYTHON) tools/autogen.py nv
