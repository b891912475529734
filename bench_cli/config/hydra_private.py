"""Every use of Hydra's private API in attnbench, behind functions with public names.

Hydra's public API (``hydra.compose``/``initialize_*``, ``@hydra.main``, ``hydra.utils``,
``hydra.core``) composes a config and runs one function; it cannot compose a run's config once and
then run it, compose a sweep's jobs without composing each whole, or search --config-dir folders
from the compose API. Where attnbench needs those, it reaches into Hydra here, and only here (and
in omegaconf_private.py for OmegaConf's nodes): tests/test_layers.py fails when another module of
bench_cli imports ``hydra._internal`` or touches a private name of Hydra or OmegaConf, and
tests/test_layers.py fails when a symbol of this list is gone from the installed Hydra.

Checked against hydra-core 1.3.8 (pyproject allows >=1.3,<1.4) and hydra-optuna-sweeper 1.3.0.
The private symbols, each with what it is used for:

- ``hydra._internal.hydra.Hydra.create_main_hydra2``: the Hydra object ``@hydra.main`` makes
  (its public methods ``compose_config`` and ``config_loader.load_sweep_config`` compose the
  run's and the jobs' configs, session.py ``HydraApp``);
- ``hydra._internal.utils.create_automatic_config_search_path``: the search path ``@hydra.main``
  builds, to which the --config-dir folders are added as ``_run_hydra`` adds one;
- ``hydra._internal.utils.get_args_parser``: Hydra's command-line flags (args.py), with
  argparse's ``ArgumentParser._actions`` (argparse keeps no public list of them);
- ``hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config``: applying a
  job's value overrides to a composed config as Hydra does; wrapped for the time of one
  composition to read the values they replace (``overrides_applied_after``);
- ``hydra._internal.config_loader_impl.ConfigLoaderImpl._parse_overrides_and_create_caching_repo``:
  the config repository of a sweep's jobs, which says which overrides name a config group;
- ``hydra._internal.config_repository.CachingConfigRepository.__init__``: replaced, once per
  process, by the same two assignments with Hydra's ConfigStore left out of the deep copy of the
  repository (``share_config_store``; the store is the ``store`` of its StructuredConfigSource);
- ``hydra._internal.config_loader_impl.create_defaults_list`` (the module's name for
  ``hydra._internal.defaults_list.create_defaults_list``), ``hydra._internal.defaults_list.Overrides``
  (its ``config_overrides`` and ``known_choices``), ``hydra._internal.defaults_list.DefaultsList``
  and ``hydra._internal.config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list``:
  replaced, once per process, by the same functions remembering what they returned
  (``remember_compositions``);
- ``hydra._internal.config_loader_impl.ConfigLoaderImpl._load_single_config``, with OmegaConf's
  ``Node._get_flag``/``_set_flag`` and ``BaseContainer._is_missing``/``_is_none``: Hydra's merge of a
  defaults list done in the same steps, from a copy of its Hydra part merged before
  (``merge_after_hydras_part``);
- ``hydra._internal.config_repository.CachingConfigRepository.load_config``: replaced, once per
  process, by the same method taking a config file's load result (``ConfigResult``: the config,
  its header and defaults list) from an earlier composition from the same config files
  (``share_loaded_configs``);
- ``hydra._internal.config_loader_impl.ConfigLoaderImpl._embed_result_config``: replaced, once per
  process, by the same placing of a loaded config under its package, without the deep copy where
  the config is a copy of this composition's own (``embed_own_copies``);
- ``hydra._internal.defaults_list._create_interpolation_map`` (with ``GroupDefault``): replaced,
  once per process, by the same function building the map only for a defaults list that has an
  interpolated entry to resolve with it (``interpolation_maps_where_used``);
- ``hydra.core.override_parser.overrides_parser.OverridesParser.parse_rule`` (public class, its
  method replaced): replaced, once per process, by the same method handing out copies of the
  overrides it parsed before (``parse_each_override_once``);
- ``hydra._internal.callbacks.Callbacks``: Hydra's callbacks around a run and a multirun;
- ``hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments`` and
  ``hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_overrides_to_chunks``: a
  sweep's grid and its batches, as the basic sweeper makes them;
- ``hydra.core.utils.JobReturn._return_value``: a failed job's exception (the public
  ``return_value`` raises it and writes to stderr);
- ``hydra_plugins.hydra_optuna_sweeper._impl.create_optuna_distribution_from_override``: the
  Optuna distribution of a search override, as the Optuna sweeper reads it.
"""
from __future__ import annotations

import copy
import weakref
from contextlib import contextmanager

from bench_cli.config.kept_config import KeptConfig, KeptLoad, loaded_copy_class
from bench_cli.config.omegaconf_private import load_each_yaml_once, parse_each_interpolation_once
from bench_cli.config.search_path import config_path, user_config_dirs


def create_hydra(task_name: str, search_path):
    """The Hydra object ``@hydra.main`` creates for a task (hydra/_internal/utils.py ``_run_hydra``),
    set as Hydra's global instance."""
    from hydra._internal.hydra import Hydra

    lighter_compositions()
    return Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path)


def lighter_compositions() -> None:
    """From now on in this process, Hydra's compositions skip nine costs that change nothing in
    what they compose: parsing again an override parsed before (``parse_each_override_once``),
    building again the defaults list and the merged config of config choices
    composed before from the same config files, and merging again Hydra's own configs into a
    merge of new choices (``remember_compositions``), loading again a config
    file an earlier composition from the same config files loaded (``share_loaded_configs``) or
    whose text was loaded before (a copy of that config instead: omegaconf_private.py
    ``load_each_yaml_once``), the copy of Hydra's ConfigStore that each composition's
    repository made (``share_config_store``), parsing again an interpolation string that was
    parsed before, in the composition or in any later resolution of its configs
    (omegaconf_private.py ``parse_each_interpolation_once``), deep-copying a loaded config that is
    already the composition's own copy as it is placed under its package (``embed_own_copies``),
    and building the map of known choices for a defaults list with no interpolation to resolve
    (``interpolation_maps_where_used``). Every Hydra attnbench creates (``create_hydra``) calls
    this first; calling it again changes nothing."""
    parse_each_override_once()
    remember_compositions()
    share_loaded_configs()
    load_each_yaml_once()
    share_config_store()
    parse_each_interpolation_once()
    embed_own_copies()
    interpolation_maps_where_used()


# What remember_compositions keeps, oldest first out past its limit: defaults lists by (search
# path's fingerprint, config name, the overrides that choose configs, prepend_hydra, skip_missing),
# merged configs by (fingerprint, the defaults list's entries).
_defaults_lists: dict = {}
_merged: dict = {}
REMEMBERED_LIMIT = 128  # distinct config choices; a merged config is about 0.15 MB of nodes
# Merged Hydra parts by (fingerprint, the leading entries that place Hydra's own configs): one per
# launcher, sweeper and logging choice, so few
_hydra_parts: dict = {}
_fingerprints: dict = {}  # fingerprint -> a small number naming it in the keys above
# The repository of each composition under way -> its fingerprint's number, taken when its defaults
# list is made (the merge and the repository's loads read it there: hashing the files is 3 ms)
_repository_fingerprints = weakref.WeakKeyDictionary()
# What share_loaded_configs keeps, oldest first out past its limit: (fingerprint's number, config
# path) -> the KeptConfig of a pickled ConfigResult (None: no source has that config)
_load_results: dict = {}
LOAD_RESULTS_LIMIT = 1024  # config files; a pickled result is a few kB


def remember_compositions() -> None:
    """From now on in this process, a composition whose config choices (the overrides that choose
    or add a config of a group: ``task=uea``, ``+experiment=...``) and config files are those of an
    earlier composition takes that composition's defaults list and a copy of its merged config,
    then applies its own value overrides (``seed=1``, ``trainer.max_epochs=2``) as Hydra does. A
    composition of new choices merges its configs after a copy of the merge of Hydra's own configs
    (``merge_after_hydras_part``).

    Hydra composes in two steps (hydra/_internal/config_loader_impl.py ``_load_configuration_impl``):
    the defaults list and the merge of its configs, which read the config files and only the
    overrides that are not value overrides (defaults_list.py ``Overrides`` puts those aside as
    ``config_overrides``), then the value overrides applied to the merged config. The first step is
    four fifths of a composition's CPU (0.11 of 0.13 s for ``task=uea model=attention_bn``), and
    `attnbench` composes the same choices many times (`run` checks its config, then runs it; a
    sweep's jobs differ in values; the test suite composes the default choices over 250 times).

    Both steps are remembered under the fingerprint of the composition's config sources
    (source_fingerprint.py: every config file's text, the ConfigStore's entries), so an edited,
    added or removed config file is composed anew, and never for a search path with a source that
    cannot be fingerprinted. What fails is not remembered: it fails the same way each time. The
    overrides are parsed and classified by Hydra each time (its errors about them are its own).
    What is handed out is the caller's own (Hydra sets flags on the merged config, then the
    overrides): a copy (kept_config.py), without the values of cached resolvers (``${now:...}``),
    which it resolves anew. Calling this again changes nothing."""
    from hydra._internal import config_loader_impl
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    if getattr(config_loader_impl.create_defaults_list, "unremembered", None) is not None:
        return
    create_defaults_list = config_loader_impl.create_defaults_list
    compose_from_defaults = ConfigLoaderImpl._compose_config_from_defaults_list

    def remembered_defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
        from hydra._internal.defaults_list import DefaultsList, Overrides

        fingerprint = _fingerprint_number(repo)
        if fingerprint is None:
            return create_defaults_list(repo=repo, config_name=config_name, overrides_list=overrides_list,
                                        prepend_hydra=prepend_hydra, skip_missing=skip_missing)
        _repository_fingerprints[repo] = fingerprint
        values = Overrides(repo=repo, overrides_list=overrides_list).config_overrides
        choices = tuple(o.input_line for o in overrides_list
                        if not o.is_sweep_override() and not any(o is value for value in values))
        key = (fingerprint, config_name, choices, prepend_hydra, skip_missing)
        if key not in _defaults_lists:
            made = create_defaults_list(repo=repo, config_name=config_name, overrides_list=overrides_list,
                                        prepend_hydra=prepend_hydra, skip_missing=skip_missing)
            _remember(_defaults_lists, key, made)
            return made
        kept = _defaults_lists[key]
        overrides = copy.copy(kept.overrides)
        overrides.config_overrides = values
        overrides.known_choices = dict(kept.overrides.known_choices)
        return DefaultsList(defaults=list(kept.defaults), config_overrides=values, defaults_tree=kept.defaults_tree,
                            overrides=overrides)

    def remembered_merge(self, defaults, repo):
        fingerprint = _repository_fingerprints.get(repo)
        if fingerprint is None:
            fingerprint = _fingerprint_number(repo)
        if fingerprint is None:
            return compose_from_defaults(self, defaults=defaults, repo=repo)
        key = (fingerprint, entries_key(defaults))
        if key not in _merged:
            merged = merge_after_hydras_part(self, defaults, repo, fingerprint)
            # what the merge resolved with a cached resolver (Hydra's ``now`` in hydra.run.dir) is
            # resolved again by each composition handed out: at its first use, not the first merge's
            cache = OmegaConf.get_cache(merged)
            OmegaConf.clear_cache(merged)
            _remember(_merged, key, KeptConfig(merged))
            OmegaConf.set_cache(merged, cache)
            return merged
        return _merged[key].copy()

    remembered_defaults_list.unremembered = create_defaults_list  # Hydra's, for the tests to compare with
    remembered_merge.unremembered = compose_from_defaults
    config_loader_impl.create_defaults_list = remembered_defaults_list
    ConfigLoaderImpl._compose_config_from_defaults_list = remembered_merge


def entries_key(defaults: list) -> tuple:
    """A defaults list's entries (Hydra's ResultDefault: config path, parent, package, ...) as a
    key of what remember_compositions keeps."""
    return tuple(tuple(vars(entry).items()) for entry in defaults)


def merge_after_hydras_part(loader, defaults: list, repo, fingerprint: int):
    """Hydra's merge of a defaults list (config_loader_impl.py ``_compose_config_from_defaults_list``:
    each entry's config loaded and merged in order into a new config, then the defaults lists left
    in the nodes removed), starting from a copy of the merge of its leading entries that place
    Hydra's own configs (package ``hydra`` or ``hydra.*``: output, launcher, sweeper, help,
    logging, env and ``hydra/config``, which the defaults list puts first) when an earlier
    composition from the same config files merged the same entries: two fifths of a new
    composition's merge, the same in every composition of a process. Merging in order from the
    merged prefix is what Hydra's loop does after those entries; the prefix is kept (a KeptConfig)
    before the later entries are merged into it and before the defaults lists are removed."""
    from omegaconf import OmegaConf

    n = 0
    while n < len(defaults) and (defaults[n].package or "").partition(".")[0] == "hydra":
        n += 1
    key = (fingerprint, entries_key(defaults[:n]))
    kept = _hydra_parts.get(key) if n else None
    if kept is not None:
        cfg = kept.copy()
    else:
        cfg = _merged_in_order(loader, OmegaConf.create(), defaults[:n], repo)
        if n:
            _remember(_hydra_parts, key, KeptConfig(cfg))
    _merged_in_order(loader, cfg, defaults[n:], repo)
    _without_defaults_lists(cfg)
    return cfg


def _merged_in_order(loader, cfg, defaults: list, repo):
    """``cfg`` with the config of each entry of ``defaults`` merged into it in order, as Hydra's
    loop merges them (its nodes placed without a deep copy, its errors named by the config file)."""
    import sys

    from hydra.errors import ConfigCompositionException
    from omegaconf import flag_override
    from omegaconf.errors import OmegaConfBaseException

    with flag_override(cfg, "no_deepcopy_set_nodes", True):
        for default in defaults:
            loaded = loader._load_single_config(default=default, repo=repo)
            try:
                cfg.merge_with(loaded.config)
            except OmegaConfBaseException as e:
                raise ConfigCompositionException(
                    f"In '{default.config_path}': {type(e).__name__} raised while composing config:\n{e}"
                ).with_traceback(sys.exc_info()[2]) from e
    return cfg


def _without_defaults_lists(cfg) -> None:
    """The defaults lists left in the merged nodes removed, as Hydra's merge ends (its
    ``strip_defaults``)."""
    from omegaconf import DictConfig, flag_override

    if not isinstance(cfg, DictConfig) or cfg._is_missing() or cfg._is_none():
        return
    with flag_override(cfg, ["readonly", "struct"], False):
        if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
            cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
            cfg.pop("defaults", None)
    for _key, value in cfg.items_ex(resolve=False):
        _without_defaults_lists(value)


def _fingerprint_number(repo) -> int | None:
    from bench_cli.config.source_fingerprint import repository_fingerprint

    fingerprint = repository_fingerprint(repo)
    if fingerprint is None:
        return None
    return _fingerprints.setdefault(fingerprint, len(_fingerprints))


def _remember(kept: dict, key, value, limit: int = REMEMBERED_LIMIT) -> None:
    kept[key] = value
    if len(kept) > limit:
        del kept[next(iter(kept))]


# What parse_each_override_once keeps, oldest first out past its limit: an override's text -> the
# Override Hydra's parser made of it, never handed out
_parsed_overrides: dict = {}
PARSED_OVERRIDES_LIMIT = 8192  # distinct override texts; an Override is a few hundred bytes


def parse_each_override_once() -> None:
    """From now on in this process, Hydra's override parser (overrides_parser.py
    ``OverridesParser.parse_rule``, ANTLR: 0.27 ms an override here) parses each override text
    once and hands out deep copies of that parse (0.016 ms): every composition parses all of its
    overrides again (a sweep's plan composes each job; the test suite parsed about 34,000, 2% of
    its CPU). Only texts without a parenthesis are kept: a parse of those calls none of the grammar's
    functions (``int(...)``, ``glob(...)``, ``shuffle(...)``, which draws a new order at each
    parse), so it depends on the text alone. A text that fails to parse is not kept: it raises
    Hydra's error each time. Each caller gets its own copy, free to change (Hydra sets its
    ``config_loader``), as from a parse of its own."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if getattr(OverridesParser.parse_rule, "unkept", None) is not None:
        return
    original = OverridesParser.parse_rule

    def parse_rule(self, s: str, rule_name: str):
        if rule_name != "override" or not isinstance(s, str) or "(" in s:
            return original(self, s, rule_name)
        parsed = _parsed_overrides.get(s)
        if parsed is None:
            parsed = original(self, s, rule_name)
            _remember(_parsed_overrides, s, parsed, PARSED_OVERRIDES_LIMIT)
        return copy.deepcopy(parsed)

    parse_rule.unkept = original  # Hydra's, for tests/test_lighter_compositions.py to compare with
    OverridesParser.parse_rule = parse_rule


def share_loaded_configs() -> None:
    """From now on in this process, a composition's repository loads a config file that an earlier
    composition from the same config files (the same fingerprint: source_fingerprint.py) loaded as
    a copy of that load's result, instead of finding its source, reading it and parsing its defaults
    list again (config_repository.py ``ConfigRepository.load_config``): a fifth of a new
    composition's CPU, most of it for Hydra's own configs (hydra/config, job_logging, launcher...),
    which every composition loads. The copies are unpickled (kept_config.py), so each composition
    has its own, as Hydra's own loads give it; within a composition the repository still hands out
    one result per path (its ``cache``). A copy's config is unpickled when it is first read
    (``LoadedCopy``): building the defaults list reads only the header and the defaults list of
    each file, and a merge that starts from a kept merge (``remember_compositions``,
    ``merge_after_hydras_part``) never reads the configs of Hydra's own files, nine of a
    composition's seventeen. A repository whose fingerprint is not known (composed outside
    ``remember_compositions``, or of a source that cannot be fingerprinted) loads as Hydra does; a
    load that fails is not kept: it fails the same way each time."""
    from hydra._internal.config_repository import CachingConfigRepository

    if getattr(CachingConfigRepository.load_config, "unshared", None) is not None:
        return
    original = CachingConfigRepository.load_config

    def load_config(self, config_path: str):
        fingerprint = _repository_fingerprints.get(self)
        cache_key = f"config_path={config_path}"  # Hydra's key in self.cache
        if fingerprint is None or cache_key in self.cache:
            return original(self, config_path)
        key = (fingerprint, config_path)
        if key not in _load_results:
            result = self.delegate.load_config(config_path=config_path)
            _remember(_load_results, key, KeptLoad(result) if result is not None else None, LOAD_RESULTS_LIMIT)
        kept = _load_results[key]
        result = kept.copy() if kept is not None else None
        self.cache[cache_key] = result
        return result

    load_config.unshared = original  # Hydra's, for tests/test_lighter_compositions.py to compare with
    CachingConfigRepository.load_config = load_config


def embed_own_copies() -> None:
    """From now on in this process, a loaded config placed under its package for the merge
    (config_loader_impl.py ``_embed_result_config``: ``OmegaConf.update`` of a new config at the
    package's key) is placed there as it is, not deep-copied, where it is a copy this composition
    owns: one that share_loaded_configs handed out, placed for the first time (a config file named
    twice in a defaults list is placed a second time from a new copy of its load result, as Hydra
    places a second deep copy of the one it cached). The copy went straight into the merge, as
    Hydra's deep copy does, with the same nodes, flags and parents; a ninth of a new composition's
    CPU. Any other load result (of a source that cannot be fingerprinted) is placed as Hydra does."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf, flag_override

    embed = ConfigLoaderImpl._embed_result_config
    if getattr(embed, "copying", None) is not None:
        return
    LoadedCopy = loaded_copy_class()

    def _embed_result_config(ret, package_override):
        package = ret.header["package"] if package_override is None else package_override
        # a config Hydra replaced after the load (merged with a schema of the same name) is placed as Hydra does
        if not package or not isinstance(ret, LoadedCopy) or ret.replaced:
            return embed(ret, package_override)
        # placed before: its nodes are in the merge now; Hydra's cached load result is still the one loaded
        config = ret.fresh_config() if ret.placed else ret.config
        ret.placed = True
        cfg = OmegaConf.create()
        with flag_override(cfg, "no_deepcopy_set_nodes", True):  # unset again on leaving, as create() left it
            OmegaConf.update(cfg, package, config, merge=False)
        placed = copy.copy(ret)
        placed.config = cfg
        return placed

    _embed_result_config.copying = embed  # Hydra's, for tests/test_lighter_compositions.py to compare with
    ConfigLoaderImpl._embed_result_config = staticmethod(_embed_result_config)


def interpolation_maps_where_used() -> None:
    """From now on in this process, the map of the choices known so far that Hydra builds for each
    config of a defaults tree (defaults_list.py ``_create_interpolation_map``: a new OmegaConf
    config of every choice, a sixth of a new composition's CPU) is built only for a defaults list
    with an interpolated entry (``- db: ${task}``), the only entries it is read for
    (``_create_defaults_tree_impl`` resolves them with it after its loop over the list). For any
    other list the map is None: were an entry to need it after all, its resolution would fail
    loudly, never compose something else."""
    from hydra._internal import defaults_list as defaults_module
    from hydra.core.default_element import GroupDefault

    create_map = defaults_module._create_interpolation_map
    if getattr(create_map, "always", None) is not None:
        return

    def interpolated(entry) -> bool:
        """The entries ``_create_defaults_tree_impl`` resolves with the map: neither _self_ nor an
        override nor a list of options (whose items may not interpolate), and interpolated."""
        if entry.is_self() or entry.is_override():
            return False
        if isinstance(entry, GroupDefault) and entry.is_options():
            return False
        return entry.is_interpolation()

    def _create_interpolation_map(overrides, defaults_list, self_added):
        if any(interpolated(entry) for entry in defaults_list):
            return create_map(overrides, defaults_list, self_added)
        return None

    _create_interpolation_map.always = create_map  # Hydra's, for tests/test_lighter_compositions.py to compare with
    defaults_module._create_interpolation_map = _create_interpolation_map


def share_config_store() -> None:
    """Each composition's CachingConfigRepository deep-copies the repository it reads through (so
    that re-initialising its sources for ``hydra.searchpath`` leaves Hydra's own alone:
    config_repository.py ``CachingConfigRepository.__init__``), and with it the ConfigStore its
    StructuredConfigSource holds: every structured config registered, a sixteenth of a
    composition's CPU. Here the copy shares the store. The store is the process's one
    ``ConfigStore.instance()`` (a source made for a new search path takes it too), read only through
    ``load`` (which deep-copies the node it returns), ``get_type`` and ``list``, so sharing it
    differs from the copy only in seeing a config stored after the repository was made, as every
    later composition sees it."""
    from hydra._internal.config_repository import CachingConfigRepository
    from hydra.core.config_store import ConfigStore

    if getattr(CachingConfigRepository.__init__, "copies_store", None) is not None:
        return
    original = CachingConfigRepository.__init__

    def __init__(self, delegate) -> None:
        # found by what they hold: Hydra's plugin scan re-imports its core_plugins modules, so a
        # source may be of another StructuredConfigSource class than one imported here
        stores = [getattr(source, "store", None) for source in delegate.get_sources()]
        shared = {id(store): store for store in stores if isinstance(store, ConfigStore)}
        self.delegate = copy.deepcopy(delegate, shared)
        self.cache = {}

    __init__.copies_store = original  # Hydra's, for tests/test_lighter_compositions.py to compare with
    CachingConfigRepository.__init__ = __init__


def hydra_search_path(calling_module: str, primary: str, config_dir=None):
    """Hydra's search path for a function of ``calling_module`` with config_path ``primary``, with
    the --config-dir folders added as hydra/_internal/utils.py ``_run_hydra`` (add_conf_dir) adds
    one (``config_dir`` first, then those the CLI took), and conf/ after a --config-path folder."""
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_automatic_config_search_path(None, calling_module, primary)
    if config_path() is not None:  # after the root config's folder (the main entry): conf/'s groups
        search_path.prepend(provider="attnbench", path="pkg://attnbench.conf",
                            anchor=SearchPathQuery(provider="schema"))
    folders = [config_dir] if config_dir else []
    for folder in [*folders, *(d for d in user_config_dirs() if d not in folders)]:
        search_path.prepend(provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
    return search_path


def hydra_flag_actions() -> list:
    """The argparse actions of Hydra's command-line parser (its flags, their nargs and choices)."""
    from hydra._internal.utils import get_args_parser

    return list(get_args_parser()._actions)


def apply_value_overrides(values: list, cfg) -> None:
    """Apply parsed value overrides (``key=value``, ``+key``, ``~key``) to a composed config, in
    their order, with the function Hydra's config loader applies them with after merging the
    defaults list (config_loader_impl.py ``_load_configuration_impl``)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)


@contextmanager
def overrides_applied_after(before):
    """For the time of the ``with``, every composition calls ``before(cfg)`` with the merged config
    just before Hydra applies the value overrides to it. Yields False (and calls nothing) where
    Hydra's loader is not the one checked here."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    apply = ConfigLoaderImpl.__dict__.get("_apply_overrides_to_config")  # a staticmethod in Hydra 1.3
    if not isinstance(apply, staticmethod):
        yield False
        return

    def call_then_apply(config_overrides, cfg) -> None:
        before(cfg)
        apply.__func__(config_overrides, cfg)

    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(call_then_apply)
    try:
        yield True
    finally:
        ConfigLoaderImpl._apply_overrides_to_config = apply


def job_repository(config_loader, config_name: str, hydra_overrides: list[str]):
    """The config repository Hydra composes a sweep's jobs with (its search path has the sweep's
    ``hydra.searchpath``); its public ``group_exists`` says which overrides choose a config."""
    _, repository = config_loader._parse_overrides_and_create_caching_repo(config_name, hydra_overrides)
    return repository


def callbacks(cfg):
    """Hydra's callbacks of a config (``hydra.callbacks``), as Hydra calls them around a run
    (``on_run_start``/``on_run_end``) and a multirun (``on_multirun_start``/``on_multirun_end``)."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(cfg)


def sweep_grid(parsed: list) -> list[list[str]]:
    """The override lists of every job of a grid, as Hydra's basic sweeper expands the parsed
    overrides (the cartesian product, in its order). Raises Hydra's HydraException."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    (grid,) = BasicSweeper.split_arguments(parsed, None)
    return grid


def sweep_batches(jobs: list[list[str]], max_batch_size: int | None) -> list[list[list[str]]]:
    """``jobs`` in the batches the basic sweeper launches (``hydra.sweeper.max_batch_size``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))


def job_error(job_return) -> BaseException | None:
    """The exception of a failed job's JobReturn, None for one that did not fail."""
    from hydra.core.utils import JobStatus

    return job_return._return_value if job_return.status == JobStatus.FAILED else None


def optuna_distribution(override):
    """The Optuna distribution of a parsed search override (``interval``, ``tag(log, ...)``,
    ``choice``, ``range``), as hydra-optuna-sweeper samples it. Imports optuna."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_optuna_distribution_from_override

    return create_optuna_distribution_from_override(override)
