"""The pages a reader follows (the README and docs/**.md) and the commands they show; shared by
test_readme.py (they parse) and test_docs_commands.py (they run)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def glassformer_commands(text: str) -> list[str]:
    """Every `glassformer ...` command line of a page: in shell blocks (joined where a line
    ends with a backslash, comments and `$ ` prompts dropped) and in inline code."""
    commands = []
    # every fenced block, paired in order (a block of another language is passed over whole,
    # so its closing fence never opens a block of prose)
    blocks = [b for lang, b in re.findall(r"```(\w*)\n(.*?)```", text, re.S)
              if lang in ("", "bash", "sh", "console")]  # fmt: skip
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s", line.strip().removeprefix("$ "))[0].strip()
            if line.startswith("glassformer "):
                commands.append(line)
    # inline: a whole command has a flag (`glassformer train` alone names the command)
    commands += [c for c in re.findall(r"`(glassformer [^`]+)`", text) if " -" in c]
    return commands
