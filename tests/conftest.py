"""Shared pytest set-up."""


def pytest_configure(config):
    # Tests that fetch from PyPI or Debian's archive; they are also marked slow, so the
    # default run (-m 'not slow') leaves them out. Run them with: pytest -m network
    config.addinivalue_line("markers", "network: needs the network (PyPI, Debian's archive)")
