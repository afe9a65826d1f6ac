"""The runner's config: mmengine's text, formatted once for as long as it is unchanged."""

import copy

import mmengine.config.config as mm_config
import pytest
from mmengine.config import Config

from mmgcu.engine.config import FormattedOnceConfig

CFG = dict(model=dict(type="Toy", layers=[1, 2, 3]), work_dir="w", seed=0)


@pytest.fixture
def formats(monkeypatch):
    """How many times yapf formats a config text."""
    calls = []
    real = mm_config.FormatCode

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mm_config, "FormatCode", counted)
    return calls


@pytest.mark.parametrize("given", [Config(CFG), CFG], ids=["config", "dict"])
def test_the_text_is_mmengines(given):
    cfg = FormattedOnceConfig.of(given)
    assert isinstance(cfg, Config)
    assert cfg.pretty_text == Config(CFG).pretty_text
    assert cfg.to_dict() == CFG


def test_none_and_a_formatted_config_pass_through():
    cfg = FormattedOnceConfig.of(CFG)
    assert FormattedOnceConfig.of(cfg) is cfg
    assert FormattedOnceConfig.of(None) is None


def test_an_unchanged_config_is_formatted_once(formats):
    cfg = FormattedOnceConfig.of(Config(CFG))
    assert cfg.pretty_text == cfg.pretty_text
    assert len(formats) == 1


def test_a_changed_config_is_formatted_again(formats):
    cfg = FormattedOnceConfig.of(Config(CFG))
    before = cfg.pretty_text
    cfg.model.layers.append(4)
    after = cfg.pretty_text
    assert after != before
    assert after == Config(cfg.to_dict()).pretty_text
    assert len(formats) == 3  # this config twice, the plain one once


def test_a_copy_keeps_its_class_and_its_text(formats):
    cfg = FormattedOnceConfig.of(Config(CFG))
    text = cfg.pretty_text
    for copied in (copy.deepcopy(cfg), copy.copy(cfg)):
        assert type(copied) is FormattedOnceConfig and copied.pretty_text == text
    assert len(formats) == 1  # mmengine's Runner deep-copies its config: the text goes along
