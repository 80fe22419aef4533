import pytest


@pytest.fixture
def wait_idle(qtbot):
    """Wait until a widget's background job is over (its worker has finished)."""

    def wait(widget, timeout=60_000):
        qtbot.waitUntil(lambda: not widget.runner.busy, timeout=timeout)

    return wait
