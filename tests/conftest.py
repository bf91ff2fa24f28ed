"""Shared pytest set-up."""

import os
import shutil
from pathlib import Path

import pytest
import torch

# The Keras twin's tests run on the torch backend (what glassformer.keras picks itself)
# unless a backend was chosen; set here so test modules may import keras before it.
os.environ.setdefault("KERAS_BACKEND", "torch")
# Which precision is faster here is forced to fp32 for the whole session, module-scoped
# fixtures included, so that a run's precision (--dtype auto, --bf16 auto, the default) and the
# suite's figures are the same on every CPU.
os.environ.setdefault("GLASSFORMER_FASTER", "fp32")


def pytest_configure(config):
    # Tests that fetch from PyPI or Debian's archive, or read released Hugging Face
    # checkpoints that only the network brings; they are also marked slow, so the default run
    # (-m 'not slow') leaves them out. Run them with: pytest -m network
    config.addinivalue_line(
        "markers",
        "network: needs the network (PyPI, Debian's archive) or the Hugging Face cache",
    )
    config.addinivalue_line(
        "markers",
        "measures_this_machine: the test measures which precision is faster here, as a user's "
        "run would (elsewhere the verdict is forced, fp32 unless GLASSFORMER_FASTER says, so "
        "that every CPU runs the same suite)",
    )
    config.addinivalue_line(
        "markers",
        "measured_choice: the result depends on a choice this machine measures (is bf16 faster "
        "than fp32?); the test runs once under each verdict, forced (GLASSFORMER_FASTER)",
    )


def pytest_generate_tests(metafunc):
    """A test marked ``measured_choice`` runs under each verdict of the speed measurement,
    so that one machine's suite covers the machines whose measurement goes the other way."""
    if metafunc.definition.get_closest_marker("measured_choice"):
        if "faster" not in metafunc.fixturenames:
            metafunc.fixturenames.append("faster")
        metafunc.parametrize("faster", ["bf16-faster", "fp32-faster"], indirect=True)


@pytest.fixture
def faster(request, monkeypatch):
    """The precision the speed measurement is forced to call faster (``measured_choice``)."""
    verdict = request.param.removesuffix("-faster")
    monkeypatch.setenv("GLASSFORMER_FASTER", verdict)
    return verdict


@pytest.fixture(autouse=True)
def _measuring(request, monkeypatch):
    """``measures_this_machine`` tests measure which precision is faster, as a user's machine
    would; ``measured_choice`` ones run under each verdict (``faster``); every other test keeps
    the session's forced verdict."""
    if request.node.get_closest_marker("measures_this_machine"):
        monkeypatch.delenv("GLASSFORMER_FASTER", raising=False)


@pytest.fixture(autouse=True)
def _fixed_gguf_rows(monkeypatch):
    """From how many rows a GGUF product of interleaved rows decodes its weight, fixed at 72
    (forced, unmeasured: ``kernels.gguf_choice``), so that no test waits for this machine's
    measurement; tests/test_gguf_choice.py measures."""
    monkeypatch.setenv("GLASSFORMER_MANY_ROWS", "72")


@pytest.fixture
def released_checkpoint():
    """``find(*repo_ids)``: the directory of a released Hugging Face checkpoint that is
    already in the local Hugging Face cache (config, weights and tokenizer all there), the
    first of ``repo_ids`` found; else the test is skipped, saying so. Nothing is downloaded."""
    hub = pytest.importorskip("huggingface_hub")

    def find(*repo_ids: str) -> Path:
        for repo in repo_ids:
            config = hub.try_to_load_from_cache(repo, "config.json")
            if not isinstance(config, str):  # None or "known not to exist": not cached
                continue
            folder = Path(config).parent
            weights = ("model.safetensors", "pytorch_model.bin")
            if (
                any((folder / w).is_file() for w in weights)
                and (folder / "tokenizer.json").is_file()
            ):
                return folder
        cache = hub.constants.HF_HUB_CACHE
        pytest.skip(
            f"{' or '.join(repo_ids)}: not in the Hugging Face cache ({cache}) with its "
            "weights and tokenizer.json; this test reads released checkpoints from there and "
            "downloads nothing"
        )

    return find


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (small tensors on a busy machine: many times faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def chat_bpe():
    """``make(folder)``: writes a byte-level BPE ``tokenizer.json`` whose specials by name
    (``<|endoftext|>``, id 0) are not the ones a chat model uses (``<|im_start|>`` 1,
    ``<|im_end|>`` 2), as a Hugging Face directory holds it; returns the folder."""
    tk = pytest.importorskip("tokenizers")

    def make(folder: Path) -> Path:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        alphabet = sorted(tk.pre_tokenizers.ByteLevel.alphabet())
        backend = tk.Tokenizer(
            tk.models.BPE(vocab={t: i for i, t in enumerate(specials + alphabet)}, merges=[])
        )
        backend.add_special_tokens(specials)
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tk.decoders.ByteLevel()
        folder.mkdir(parents=True, exist_ok=True)
        backend.save(str(folder / "tokenizer.json"))
        return folder

    return make


# ---- a real browser: Debian's chromium through Playwright (the viewer's and the docs' tests) --


def chromium_path() -> str | None:
    for candidate in (os.environ.get("GLASSFORMER_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="browser tests need Playwright: pip install playwright"
    )
    executable = chromium_path()
    if executable is None:
        pytest.skip("browser tests need Chromium: apt-get install chromium")
    with sync_api.sync_playwright() as p:
        try:
            launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as e:  # noqa: BLE001 - any failure to start is a reason to skip
            pytest.skip(f"Chromium at {executable} did not start: {str(e).splitlines()[0]}")
        yield launched
        launched.close()


# ---- the support matrix (glassformer models, the docs' families page) ----------------------
# Each family's tests record what they proved; a passing run of the whole suite (every
# family recorded) writes src/glassformer/interop/support.json. Nothing is written by hand.
SHOWN: dict[str, set[str]] = {}


@pytest.fixture
def support():
    """``support(family, *capabilities)``: call it once the test has proved them."""

    def record(family: str, *capabilities: str) -> None:
        from glassformer.interop.support import CAPABILITIES

        unknown = set(capabilities) - set(CAPABILITIES)
        assert not unknown, f"unknown capabilities {unknown}"
        SHOWN.setdefault(family, set()).update(capabilities)

    return record


def pytest_sessionfinish(session, exitstatus):
    from glassformer.interop.support import FAMILIES, write_support

    everyone = {family for family, _, _ in FAMILIES}
    if exitstatus == 0 and everyone <= set(SHOWN) and not session.config.option.keyword:
        write_support(SHOWN)


@pytest.fixture
def builds_on(monkeypatch):
    """``builds_on(cls)``: a list that gets the default device's type ("meta", "cpu") each
    time ``cls`` is built, so a test can show a loader built a model on the meta device
    only, never for real, before refusing it."""

    def watch(cls: type) -> list[str]:
        devices: list[str] = []
        build = cls.__init__

        def recording(self, config):
            devices.append(torch.empty(0).device.type)
            build(self, config)

        monkeypatch.setattr(cls, "__init__", recording)
        return devices

    return watch
