"""glassformer.keras picks the torch backend unless told otherwise, the core package never
imports Keras, and the layers import no torch (they compute with keras.ops)."""

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import glassformer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None, reason="needs the keras extra"
)


def run(code: str, **env: str) -> str:
    import os

    environ = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"} | env
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_core_package_does_not_import_keras_and_the_backend_defaults_to_torch():
    out = run(
        """
        import sys
        import glassformer, glassformer.cli, glassformer.training.tasks
        print("keras" in sys.modules)
        import glassformer.keras, keras
        print(keras.backend.backend())
        """
    )
    assert out.splitlines() == ["False", "torch"]


def test_a_chosen_backend_is_respected():
    """TensorFlow is not installed here, so choosing it makes Keras's import name it."""
    out = run(
        """
        try:
            import glassformer.keras
        except ImportError as e:
            print(e)
        """,
        KERAS_BACKEND="tensorflow",
    )
    assert "tensorflow" in out


LAYER_MODULES = [
    "attention",
    "position",
    "feedforward",
    "block",
    "masks",
    "common",
    "classifier",
    "encoder_lm",
]


@pytest.mark.parametrize("name", LAYER_MODULES)
def test_the_layers_use_keras_ops_not_torch(name):
    """No torch in the layers, so they can run on JAX or TensorFlow (not installed here)."""
    path = Path(glassformer.__file__).parent / "keras" / f"{name}.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "torch" not in imported and "keras" in imported
