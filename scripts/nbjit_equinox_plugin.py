"""pytest plugin: equinox's own tests with `equinox.filter_jit = nbjit.filter_jit`.

Loaded with ``-p nbjit_equinox_plugin`` (scripts/ on PYTHONPATH) by
scripts/library_tests.sh's equinox mode. Only the public name is rebound,
as a user would: equinox's internal uses of its own filter_jit (bound at its
import) stay equinox's. The rebinding waits for the session start, because
equinox's pytest configuration has jaxtyping instrument equinox at import.
"""


def pytest_sessionstart(session):
    import equinox

    import nbjit

    equinox.filter_jit = nbjit.filter_jit


def pytest_report_header(config):
    return "nbjit: equinox.filter_jit = nbjit.filter_jit"
