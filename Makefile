# glassformer — every target creates and uses .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-all bench lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,data]'
	touch $(STAMP)

install: $(STAMP)

## The main job on the bundled data: train a sentiment classifier on IMDb reviews for six
## minutes, report its held-out accuracy, and classify a few sentences a person can judge.
demo: $(STAMP)
	$(BIN)/glassformer train classify --corpus imdb --minutes 5 --out runs/demo-imdb
	$(BIN)/glassformer classify --model runs/demo-imdb \
	  "One of the best films I have seen: moving, funny and beautifully acted." \
	  "A dull, predictable mess. I wanted my two hours back." \
	  "The plot was thin but the actors made it worth watching."

## The fast test suite (slow tests excluded; see test-all).
test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
