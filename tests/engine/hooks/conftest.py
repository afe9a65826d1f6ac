"""Each hook test starts without TOPS_VISIBLE_DEVICES (it remaps physical cards)."""

import pytest


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    monkeypatch.delenv("TOPS_VISIBLE_DEVICES", raising=False)
