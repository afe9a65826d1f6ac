"""Each test starts with no chosen backend and no TOPS_VISIBLE_DEVICES."""

import pytest

from mmgcu.device import reset_backend


@pytest.fixture(autouse=True)
def fresh_backend(monkeypatch):
    monkeypatch.delenv("TOPS_VISIBLE_DEVICES", raising=False)
    reset_backend()
    yield
    reset_backend()
