# Two entry points on a fresh machine (Python 3.10+, pip):
#   make demo   - repack the bundled tiny gpt-oss for a target, verify it, print a summary
#   make test   - the test suite (what CI runs)
# Both create .venv on first use. The constraints file pins the CPU build of torch so that pip
# does not pull the CUDA build and its ~20 nvidia wheels (shared/docs/deps.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TARGET ?= bf16
DEMO := build/demo

.PHONY: demo test venv clean

$(BIN)/repack: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

venv: $(BIN)/repack

demo: venv
	$(BIN)/repack make-fixture $(DEMO)/tiny-gpt-oss --overwrite
	$(BIN)/repack inspect $(DEMO)/tiny-gpt-oss
	$(BIN)/repack $(DEMO)/tiny-gpt-oss --target $(TARGET) --out $(DEMO)/tiny-gpt-oss-$(TARGET) --overwrite
	$(BIN)/repack verify $(DEMO)/tiny-gpt-oss-$(TARGET)

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build
