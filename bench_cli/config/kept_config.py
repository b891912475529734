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
"""
from __future__ import annotations

import copy
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
