"""``FormattedOnceConfig``: the runner's config, formatted once for as long as it is unchanged.

mmengine formats the whole config through yapf on every read of ``Config.pretty_text``,
and a run reads it several times on every rank: ``Runner._log_env`` (also where the rank's
logger prints nothing), ``RuntimeInfoHook.before_run``, ``Runner.dump_config`` and every
``save_checkpoint`` on rank 0. Each read took 0.2 to 0.4 s of CPU here: a tenth of the
T20 leg of the test suite was yapf. The text is kept with the
config it was made from and made again when the config has changed since; in a
distributed run rank 0 formats it for every rank whose config is the same (one object
broadcast at set-up), so eight ranks on a host format it once, not eight times.
"""

import hashlib

from mmengine.config import Config
from mmengine.dist import broadcast_object_list, get_rank


class FormattedOnceConfig(Config):
    """A :class:`mmengine.config.Config` whose :attr:`pretty_text` is formatted once per
    content: the same text as mmengine's, made again after the config changes."""

    @classmethod
    def of(cls, cfg):
        """``cfg`` (a ``Config`` or a dict) as this class; None stays None. A ``Config``
        shares its content with the one returned (mmengine's Runner deep-copies it)."""
        if cfg is None or isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, Config):
            return cls(cfg)
        formatted = cls.__new__(cls)
        formatted.__setstate__(cfg.__getstate__())
        return formatted

    @property
    def pretty_text(self) -> str:
        key = self._content()
        cached = self.__dict__.get("_formatted")
        if cached is None or cached[0] != key:
            cached = (key, Config.pretty_text.fget(self))
            self._keep(key, cached[1])
        return cached[1]

    def share_from_rank_0(self) -> bool:
        """Rank 0 formats the text and gives it to every rank: call on all ranks at once,
        once the process group exists. A rank whose config differs from rank 0's keeps
        formatting its own. Returns whether this rank took rank 0's text.

        A config rank 0 cannot format (mmengine's ``SyntaxError``) is raised on rank 0
        after the broadcast: the other ranks go on (to format their own text and raise it
        too, or to find rank 0 gone at their next collective) instead of waiting for rank
        0's text until the collective times out."""
        key = self._content()
        digest = hashlib.sha256(key.encode()).hexdigest()
        sent, failed = [None], None
        if get_rank() == 0:
            try:
                sent = [(digest, self.pretty_text)]
            except Exception as exc:  # raised below, once the other ranks are told
                sent, failed = [(None, None)], exc
        broadcast_object_list(sent, src=0)
        if failed is not None:
            raise failed
        their_digest, text = sent[0]
        if their_digest != digest:
            return False
        self._keep(key, text)
        return True

    def _content(self) -> str:
        return repr(self.to_dict())

    def _keep(self, key: str, text: str) -> None:
        # Config routes attribute access to its content: the text lives in __dict__.
        object.__setattr__(self, "_formatted", (key, text))
