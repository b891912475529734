"""A config kept to hand out copies of, each the caller's own to change.

The copies are unpickled from one pickle of the config, not ``copy.deepcopy``'d: OmegaConf's own
round trip (``BaseContainer.__getstate__`` / ``__setstate__``, the one Hydra's launchers send job
configs through) keeps every node's value, flags and metadata (a typed container's ``ref_type`` is
rebuilt from its key and element types), at a fifth of deepcopy's CPU (8 -> 2 ms for a composed
config with Hydra's node; 4 -> 0.8 ms for attnbench's root config file). Compositions hand out such
copies thousands of times in a sweep's planning and in the test suite (hydra_private.py
``remember_compositions``, omegaconf_private.py ``load_each_yaml_once``); Hydra's load result of a
config file (its ``ConfigResult``: the config, header and defaults list) is kept the same way
(hydra_private.py ``share_loaded_configs``).

Keep only root configs (the callers keep what OmegaConf.load, Hydra's merge and Hydra's load
return): a node's pickle would carry copies of its parents. A config holding a value that cannot be
pickled is deep-copied instead, as before.

A load result is kept as two pickles (``KeptLoad``): its config, and the rest (header, defaults
list). A copy's config is unpickled only when it is read (``loaded_copy_class``): most of a
composition's loads are read for their headers and defaults lists alone.
"""
from __future__ import annotations

import copy
import functools
import pickle

from typing import Any


class KeptConfig:
    def __init__(self, cfg: Any) -> None:
        try:
            self._pickled, self._config = pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL), None
        except Exception:  # noqa: BLE001 - any value pickle refuses: deep copies, as before
            self._pickled, self._config = None, copy.deepcopy(cfg)

    def copy(self) -> Any:
        """A new copy, sharing nothing with the config kept or with earlier copies."""
        return pickle.loads(self._pickled) if self._pickled is not None else copy.deepcopy(self._config)


class KeptLoad:
    """A config file's load result (Hydra's ``ConfigResult``) kept to hand out copies of: its
    config and the rest (provider, path, header, defaults list), each pickled."""

    def __init__(self, result) -> None:
        rest = copy.copy(result)
        rest.config = None
        self.rest, self.config = KeptConfig(rest), KeptConfig(result.config)

    def copy(self):
        """A LoadedCopy (``loaded_copy_class``), its config not unpickled yet."""
        return loaded_copy_class()(self, vars(self.rest.copy()))


@functools.cache
def loaded_copy_class():
    """LoadedCopy, made on first use: a subclass of Hydra's ConfigResult, whose module is imported
    only where Hydra is used."""
    from hydra.plugins.config_source import ConfigResult

    class LoadedCopy(ConfigResult):
        """A copy of a kept load result, the composition's own, whose config is unpickled when
        first read. ``replaced``: Hydra set another config (merged with a schema of the same
        name); ``placed``: hydra_private.embed_own_copies has placed the config under its package."""

        def __init__(self, kept: KeptLoad, fields: dict) -> None:  # ConfigResult's fields but the config
            fields.pop("config", None)
            self.__dict__.update(fields, _kept=kept, _config=None, replaced=False, placed=False)

        @property
        def config(self):
            if self._config is None:
                self._config = self._kept.config.copy()
            return self._config

        @config.setter
        def config(self, value) -> None:
            self._config, self.replaced = value, True

        def fresh_config(self):
            """Another copy of the config as loaded (for a second placement of the same file)."""
            return self._kept.config.copy()

    return LoadedCopy
