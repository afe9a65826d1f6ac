"""Each test starts with no chosen backend, no device group and no re-based wrapper class."""

import pytest

from mmgcu import dist as mdist
from mmgcu.device import reset_backend
from mmgcu.model import wrappers


@pytest.fixture(autouse=True)
def fresh_backend(monkeypatch):
    reset_backend()
    monkeypatch.setattr(mdist, "_device_group", None)
    monkeypatch.setattr(wrappers, "_rebased", {})
    yield
    reset_backend()
