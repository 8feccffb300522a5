# Two entry points on a fresh machine (Python 3.10+, pip):
#   make demo   - repack the bundled tiny trained gpt-oss for a target (sm121), verify it, measure
#                 logit KL and GPQA-style accuracy against the source, write a report, run the gate
#   make test   - the test suite (what CI runs)
# Both create .venv on first use. The constraints file pins the CPU build of torch so that pip
# does not pull the CUDA build and its ~20 nvidia wheels (shared/docs/deps.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TARGET ?= sm121
DEMO := build/demo
TINY := mxrepack/data/tiny-gpt-oss

.PHONY: demo test venv clean

$(BIN)/repack: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

venv: $(BIN)/repack

demo: venv
	mkdir -p $(DEMO)
	$(BIN)/repack inspect $(TINY)
	$(BIN)/repack $(TINY) --target $(TARGET) --out $(DEMO)/tiny-gpt-oss-$(TARGET) --overwrite
	$(BIN)/repack verify $(DEMO)/tiny-gpt-oss-$(TARGET)
	$(BIN)/repack eval logits $(TINY) $(DEMO)/tiny-gpt-oss-$(TARGET) -o $(DEMO)/logits.json
	$(BIN)/repack eval gpqa --local $(TINY) -o $(DEMO)/gpqa-source.json
	$(BIN)/repack eval gpqa --local $(DEMO)/tiny-gpt-oss-$(TARGET) --data $(TINY)/tasks/test.csv -o $(DEMO)/gpqa-$(TARGET).json
	$(BIN)/repack eval report --out $(DEMO)/report --model $(DEMO)/tiny-gpt-oss-$(TARGET) \
		--gpqa $(DEMO)/gpqa-source.json --gpqa $(DEMO)/gpqa-$(TARGET).json --logits $(DEMO)/logits.json
	$(BIN)/repack eval compare $(DEMO)/gpqa-source.json $(DEMO)/gpqa-$(TARGET).json

test: venv
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist worksteal --durations=25

clean:
	rm -rf $(VENV) build
