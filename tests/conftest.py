"""Shared pytest set-up."""

import os

import pytest
import torch

# The Keras twin's tests run on the torch backend (what glassformer.keras picks itself)
# unless a backend was chosen; set here so test modules may import keras before it.
os.environ.setdefault("KERAS_BACKEND", "torch")


def pytest_configure(config):
    # Tests that fetch from PyPI or Debian's archive; they are also marked slow, so the
    # default run (-m 'not slow') leaves them out. Run them with: pytest -m network
    config.addinivalue_line("markers", "network: needs the network (PyPI, Debian's archive)")


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (small tensors on a busy machine: many times faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
