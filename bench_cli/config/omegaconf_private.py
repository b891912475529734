"""Every use of OmegaConf's private API in attnbench: reading and setting a config's nodes in
place, OmegaConf's own YAML dumper and interpolation parser, and its ``load`` made to load each
config text once.

OmegaConf's public API reads and resolves a config whole (``OmegaConf.select``,
``to_container``); a sweep's planning sets a job's values in the shared composition of its config
choices and resolves only what differs between jobs (job_composer.py), which takes the nodes
themselves. Only this module and hydra_private.py touch private names of OmegaConf or Hydra
(tests/test_layers.py), which also fails when a symbol of this list is gone.

Checked against omegaconf 2.3.1 (with hydra-core 1.3.8). The private symbols:

- ``omegaconf.basecontainer.BaseContainer._get_node``: a container's child node, unresolved;
- ``omegaconf.base.Node._dereference_node``: the node an interpolation points at;
- ``omegaconf.base.Node._is_none``, ``omegaconf.base.Node._is_missing`` and
  ``omegaconf.base.Node._is_interpolation``: what a node holds, without resolving it;
- ``omegaconf.base.Node._metadata``: a container's ``object_type`` (a structured config's class);
- ``omegaconf.nodes.ValueNode._value`` and ``omegaconf.nodes.ValueNode._set_value``: a leaf's
  value, read and set in place (``BaseContainer._set_item_impl`` sets an untyped leaf so);
- ``omegaconf.basecontainer.BaseContainer._to_content``: ``to_container`` of one node;
- ``omegaconf.base.Node._get_full_key``: a node's dotted key from the root, for messages;
- ``omegaconf.base.parse``: the interpolation grammar's parser, replaced, once per process, by the
  same function remembering its parse trees (``parse_each_interpolation_once``);
- ``omegaconf._utils.get_omega_conf_dumper``: the YAML dumper of ``OmegaConf.to_yaml``;
- ``omegaconf.omegaconf.OmegaConf.load``: replaced, once per process, by the same function that
  loads each distinct text once and hands out copies (``load_each_yaml_once``).
"""
from __future__ import annotations

import functools
import io
import os
import pathlib

from omegaconf import DictConfig, ListConfig, OmegaConf

from bench_cli.config.kept_config import KeptConfig


def unresolved_template(cfg: DictConfig) -> tuple[dict, list[tuple]] | None:
    """(``OmegaConf.to_container(cfg)`` unresolved, the paths of its interpolations), or None for a
    config whose resolution is not the sum of its leaves' (a container that is null, missing, an
    interpolation or a structured config)."""
    paths: list[tuple] = []

    def walk(node, path: tuple) -> bool:
        for key in (node.keys() if isinstance(node, DictConfig) else range(len(node))):
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                if (child._is_none() or child._is_missing() or child._is_interpolation()
                        or isinstance(child, DictConfig) and child._metadata.object_type not in (dict, None)
                        or not walk(child, (*path, key))):
                    return False
            elif child._is_interpolation():
                paths.append((*path, key))
        return True

    return (OmegaConf.to_container(cfg), paths) if walk(cfg, ()) else None


def resolved_at(cfg: DictConfig, path: tuple):
    """The value at ``path`` of ``cfg`` resolved as ``OmegaConf.to_container(cfg, resolve=True)``
    resolves it there (a container as plain data). Raises OmegaConf's error where it does not
    resolve."""
    from omegaconf.basecontainer import BaseContainer

    node = cfg
    for key in path:
        node = node._get_node(key)
    node = node._dereference_node()
    if isinstance(node, (DictConfig, ListConfig)):
        return BaseContainer._to_content(node, resolve=True, throw_on_missing=False)
    return node._value()


def replaced_values(cfg: DictConfig, values: list) -> list | None:
    """(node, its value) of the leaf each value override replaces, when every override is a plain
    ``key=value`` whose value is a string, number or boolean at an existing key of ``cfg`` holding
    one (an untyped node: OmegaConf sets its value in place, ``BaseContainer._set_item_impl``);
    None otherwise (additions, deletions, null, lists, mappings, new keys)."""
    from omegaconf.nodes import AnyNode

    replaced = []
    for o in values:
        if o.is_add() or o.is_force_add() or o.is_delete() or type(o.value()) not in (str, int, float, bool):
            return None
        node = cfg
        for part in o.key_or_group.split("."):
            node = node._get_node(part, validate_access=False) if isinstance(node, DictConfig) else None
        if type(node) is not AnyNode:
            return None
        replaced.append((node, node._value()))
    return replaced


def restore_values(replaced: list) -> None:
    """Set back the values ``replaced_values`` read (a key overridden twice gets its first value)."""
    for node, value in reversed(replaced):
        node._set_value(value)


def full_key(config, key: str) -> str:
    """The dotted key of ``config[key]`` from its root (``profile.seq_lens``); ``key`` for plain data."""
    return config._get_full_key(key) if OmegaConf.is_config(config) else key


# OmegaConf's parser of interpolation strings, kept by parse_each_interpolation_once (None: not yet)
_unmemoised_parse = None
PARSES_LIMIT = 4096  # distinct interpolation strings (conf/ has a few hundred)


def parse_each_interpolation_once() -> None:
    """From now on in this process, OmegaConf parses each interpolation string once (for each
    grammar rule), not each time it resolves it: its parser (ANTLR, ``omegaconf.base.parse``) was
    most of the time of a sweep job's ``job_key`` and 3% of the test suite's CPU (every read of an
    interpolated value parses it again). A parse depends only on the string, and the parse trees
    are only read by the resolution (grammar_visitor.py), so one serves every config; a string that
    fails to parse is not kept: it raises the same error each time. Calling this again changes
    nothing."""
    global _unmemoised_parse
    from omegaconf import base

    if _unmemoised_parse is not None:
        return
    _unmemoised_parse = base.parse
    base.parse = functools.lru_cache(maxsize=PARSES_LIMIT)(base.parse)


def yaml_dumper():
    """The YAML dumper ``OmegaConf.to_yaml`` writes with (its representers and options)."""
    from omegaconf._utils import get_omega_conf_dumper

    return get_omega_conf_dumper()


# A YAML text -> the config OmegaConf.load made of it, never handed out (``load_each_yaml_once``): the
# oldest entries go first past LOADED_LIMIT texts.
_loaded: dict = {}
LOADED_LIMIT = 512  # conf/ has 124 files: room for a few versions of each and the user's folders


def load_each_yaml_once() -> None:
    """From now on in this process, ``OmegaConf.load`` loads each distinct YAML text once, and
    hands out copies of that config (kept_config.py).

    Hydra reads every config file of a composition with ``OmegaConf.load``, and a command composes
    many times (validation, then the run; a sweep's jobs; the suite thousands of times), each time
    parsing the same files with PyYAML's pure-Python parser and building their nodes again: a third
    of a composition's CPU. The replacement reads the whole text and looks it up by that text, so an
    edited or new file is never served stale, whatever its path or time stamps say. A text seen
    before is a copy of its config (Hydra adopts and edits what it loads, so each call gets its
    own), unpickled: a fifth of a deep copy's CPU, and none of the parser's. A text
    that fails (YAML, OmegaConf) is not kept: it raises the same error, naming the same file and line,
    each time. Calling this again changes nothing."""
    original = OmegaConf.load
    if getattr(original, "uncached", None) is not None:
        return

    def load(file_):
        if isinstance(file_, (str, pathlib.Path)):
            with open(os.path.abspath(file_), encoding="utf-8") as stream:  # as OmegaConf.load opens it
                return load(stream)
        if not (getattr(file_, "read", None) and getattr(file_, "seekable", lambda: False)()):
            return original(file_)  # what it does with anything else (TypeError, an unseekable stream)
        start = file_.tell()
        try:
            text = file_.read()
        except ValueError:  # not decodable: OmegaConf's own reading says where
            file_.seek(start)
            return original(file_)
        if text not in _loaded:
            named = _NamedStream((io.StringIO if isinstance(text, str) else io.BytesIO)(text).read,
                                 getattr(file_, "name", "<file>"))
            loaded = original(named)
            _loaded[text] = KeptConfig(loaded)
            if len(_loaded) > LOADED_LIMIT:
                del _loaded[next(iter(_loaded))]
            return loaded
        return _loaded[text].copy()

    load.uncached = original  # for tests/test_lighter_compositions.py to compare with
    OmegaConf.load = staticmethod(load)


class _NamedStream:
    """A text read as ``OmegaConf.load`` reads the file it came from: yaml's Reader reads a
    stream's ``read`` and ``name`` (an error's mark names the file, as reading the file does)."""

    def __init__(self, read, name) -> None:
        self.read, self.name = read, name
