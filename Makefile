PYTHON ?= python3

.PHONY: install test lint bench demo

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
