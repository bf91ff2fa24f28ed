"""The documentation site (mkdocs.yml, docs/) builds strictly, works opened from disk with
the network off, its search finds what it holds, and its API reference lists every public
name; the README is its front door (install and quick start on the first screen)."""

import dataclasses
import html
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The public names of ../shared/DESIGN.md ("Public API" and "Names the next work relies
# on"), each as the API reference shows it.
PUBLIC_NAMES = [
    "glassformer.scaled_dot_product_attention",
    "glassformer.MultiHeadAttention",
    "glassformer.SinusoidalPositionalEncoding",
    "glassformer.LearnedPositionalEmbedding",
    "glassformer.FeedForward",
    "glassformer.EncoderLayer",
    "glassformer.DecoderLayer",
    "glassformer.Encoder",
    "glassformer.Decoder",
    "glassformer.causal_mask",
    "glassformer.padding_mask",
    "glassformer.TransformerClassifier",
    "glassformer.ClassifierConfig",
    "glassformer.Seq2SeqTransformer",
    "glassformer.Seq2SeqConfig",
    "glassformer.GPT",
    "glassformer.GPTConfig",
    "glassformer.EncoderLM",
    "glassformer.EncoderLMConfig",
    "glassformer.BertEncoder",
    "glassformer.SentenceEncoder",
    "glassformer.load_checkpoint",
    "glassformer.save_checkpoint",
    "glassformer.RunConfig",
    "glassformer.fit",
    "glassformer.RunResult",
    "glassformer.load_run",
    "glassformer.GenerationConfig",
    "glassformer.VisionTransformer",
    "glassformer.ViTConfig",
    "glassformer.modules.Block",
    "glassformer.modules.Stack",
    "glassformer.models.Backbone",
    "glassformer.inspect.ActivationCache",
    "glassformer.inspect.logit_lens",
    "glassformer.inspect.direct_logit_attribution",
    "glassformer.inspect.activation_patching",
    "glassformer.inspect.ablate_heads",
    "glassformer.interop.from_torch_nn",
    "glassformer.interop.to_torch_nn",
    "glassformer.interop.save_gpt2",
    "glassformer.interop.from_llama_state",
    "glassformer.keras.from_torch",
    "glassformer.keras.to_torch",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `make docs` builds it (strict: any warning fails the build)."""
    pytest.importorskip("mkdocs", reason="the docs need the docs extra: pip install '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_the_site_builds_strictly_with_a_page_for_each_guide(site):
    names = {p.relative_to(site).as_posix() for p in pages(site)}
    for page in (
        "index.html",
        "getting-started.html",
        "guides/training.html",
        "guides/generation.html",
        "guides/looking-inside.html",
        "guides/images.html",
        "guides/llm.html",
        "guides/embeddings.html",
        "guides/keras.html",
        "guides/long-sequences.html",
        "hooks.html",
        "python.html",
        "performance.html",
        "tests.html",
        "architecture.html",
        "tutorial/index.html",
        "tutorial/07-vit.html",
        "reference/index.html",
    ):
        assert page in names


def test_the_api_reference_lists_every_public_name(site):
    ids = set()
    for page in (site / "reference").glob("*.html"):
        ids |= set(re.findall(r'id="(glassformer\.[\w.]+)"', page.read_text(encoding="utf-8")))
    missing = [name for name in PUBLIC_NAMES if name not in ids]
    assert not missing, f"the API reference lacks {missing}"


def test_the_reference_shows_every_runconfig_field_with_its_flag_and_help(site):
    from glassformer.training.config import RunConfig

    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert "{{ runconfig_fields }}" not in page
    for f in dataclasses.fields(RunConfig):
        flag = f.name if f.name == "task" else "--" + f.name.replace("_", "-")
        row = f"<td><code>{f.name}</code></td>\n<td><code>{flag}</code></td>"
        assert row in page, f"no row for {f.name}"
        assert html.escape(f.metadata["help"], quote=False) in page, f.name


def test_no_page_asks_for_anything_outside_the_site(site):
    """No web font, no CDN script or style: every src and stylesheet is a relative path."""
    for page in pages(site):
        html = page.read_text(encoding="utf-8")
        external = re.findall(r'(?:src|href)="((?:https?:)?//[^"]+)"[^>]*>', html)
        assets = [u for u in external if re.search(r"\.(js|css|woff2?|ttf)\b|fonts\.", u)]
        assert not assets, (page.name, assets)


class OfflinePage:
    """A page of the site opened from disk, every request outside file:// refused."""

    def __init__(self, browser, path: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("requestfailed", lambda r: self.failed.append(r.url))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.as_uri(), wait_until="load")

    def _route(self, route):
        if route.request.url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()

    def close(self):
        self.context.close()


@pytest.mark.browser
def test_every_page_loads_from_disk_offline_without_a_failed_request_or_error(site, browser):
    for path in pages(site):
        opened = OfflinePage(browser, path)
        opened.page.wait_for_timeout(50)
        title = opened.page.title()
        opened.close()
        assert (opened.refused, opened.failed, opened.errors) == ([], [], []), path
        assert "glassformer" in title, path


@pytest.mark.browser
def test_search_from_disk_finds_hook_pattern(site, browser):
    opened = OfflinePage(browser, site / "index.html")
    page = opened.page
    page.click("input.md-search__input")
    page.keyboard.type("hook_pattern")
    deadline = time.monotonic() + 15
    found: list[str] = []
    while time.monotonic() < deadline and not found:
        page.wait_for_timeout(200)
        found = page.eval_on_selector_all(
            ".md-search-result__item a", "links => links.map(a => a.getAttribute('href'))"
        )
    opened.close()
    assert any("hooks.html" in href for href in found), found
    assert (opened.refused, opened.failed, opened.errors) == ([], [], [])


def test_the_readme_puts_install_and_the_quick_start_on_the_first_screen():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    first_screen = "\n".join(lines[:60])
    assert "## Install" in first_screen and "pip install" in first_screen
    assert "## Quick start" in first_screen
    assert "make demo" in first_screen and "make test" in first_screen
    assert len(lines) <= 250, f"the README is {len(lines)} lines: move detail to docs/"
