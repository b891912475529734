"""The keys a config has and may gain: every top-level key a composition can have (read without
Hydra), where ``+key=value`` may add one (``ADDABLE``), and a hint naming the close keys of a
misspelt one."""
from __future__ import annotations

import functools
import re
from pathlib import Path

from omegaconf import DictConfig

from bench_cli.config.index import root_config, yaml_loader
from bench_cli.config.search_path import config_dirs
from bench_cli.core.errors import did_you_mean

# Where a new key may be added with `+key=value`: option mappings whose consumer checks every key
# it gets (an attention's constructor, a backbone's, the ListOps generator's), the per-dataset
# tables, Hydra's own config. Anywhere else a new key would be read by nothing, so it is refused
# instead of silently ignored.
ADDABLE = ("model.attention.", "model.final_attention.", "model.cross_attention.", "task.backbone.",
           "task.generator.", "per_dataset.", "hydra.")


def addable(key: str) -> bool:
    return key.startswith(ADDABLE)



def top_level_keys() -> set[str]:
    """Every top-level key a composed config can have (a superset): the root config's, the config
    groups', and those of options packaged elsewhere (``# @package _global_`` experiments)."""
    return _top_level_keys(tuple(config_dirs()))


@functools.lru_cache(maxsize=8)
def _top_level_keys(folders: tuple[Path, ...]) -> set[str]:
    import yaml

    def keys_of(stream) -> list[str]:  # the document's node tree only: constructing it costs more
        node = yaml.compose(stream, Loader=yaml_loader())
        return [k.value for k, _ in node.value] if isinstance(node, yaml.MappingNode) else []

    keys = {"hydra", *root_config().keys()}
    for folder in folders:
        keys.update(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("_"))
        for path in folder.rglob("*.yaml"):
            with path.open() as f:
                package = re.match(r"\s*#\s*@package\s+(\S+)", f.readline())
                if package and package.group(1) == "_global_":
                    keys.update(keys_of(f))
                elif package:
                    keys.add(package.group(1).split(".")[0])
    keys.discard("defaults")  # a _global_ experiment's defaults list, not a config key
    return keys


def key_hint(config, key: str, list_keys: bool = True) -> str:
    """For a dotted key ``config`` lacks, about its first missing part: " (did you mean
    'trainer.max_epochs'?)" when an existing key there is close, else (``list_keys``) the keys that
    are there ("; keys of trainer: ..."; at the top level both: "; top-level keys: ...")."""
    parts = key.split(".")
    node, depth = config, 0
    while depth < len(parts) - 1 and isinstance(node, (dict, DictConfig)) and parts[depth] in node:
        try:
            node, depth = node[parts[depth]], depth + 1
        except Exception:  # an interpolation that cannot be resolved here
            return ""
    if not isinstance(node, (dict, DictConfig)):
        return ""
    prefix = ".".join(parts[:depth])
    # at the top level, the keys any composition can have (a superset of the composed config's), so
    # the quick check, which composes nothing, and Hydra's refusal say the same
    keys = sorted(str(k) for k in node.keys()) if prefix else sorted(top_level_keys())
    close = did_you_mean(parts[depth], keys)
    if prefix:
        close = close.replace("'", f"'{prefix}.", 1)
        return close or (f"; keys of {prefix}: {', '.join(keys)}" if list_keys else "")
    # at the top level names are short and a close one is often not the one meant: list them too
    return close + (f"; top-level keys: {', '.join(keys)}" if list_keys else "")


