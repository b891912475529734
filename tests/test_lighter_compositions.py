"""Hydra's compositions made lighter (hydra_private.lighter_compositions: each config text loaded
once per process, Hydra's ConfigStore shared, not copied, by each composition's repository) compose
exactly what Hydra composes, never serve a config file as it was before an edit, and fail as
OmegaConf fails."""
from __future__ import annotations

import copy
import os

import pytest
import yaml
from omegaconf import OmegaConf

from bench_cli.config import hydra_private, omegaconf_private
from bench_cli.config.session import compose_unchecked
from bench_cli.core.errors import UserError


@pytest.fixture
def hydra_as_is(monkeypatch):
    """For the test: ``OmegaConf.load``, OmegaConf's interpolation parser,
    ``CachingConfigRepository.__init__`` and ``load_config``, the two steps of a composition, the
    placing of a loaded config under its package and the map of known choices as Hydra and
    OmegaConf ship them (none of this process's compositions re-install
    the lighter ones)."""
    from hydra._internal import config_loader_impl, defaults_list
    from hydra._internal.config_repository import CachingConfigRepository
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import base as omegaconf_base

    hydra_private.lighter_compositions()

    def as_is() -> None:
        loader = config_loader_impl.ConfigLoaderImpl
        monkeypatch.setattr(OmegaConf, "load", staticmethod(OmegaConf.load.uncached))
        monkeypatch.setattr(CachingConfigRepository, "__init__", CachingConfigRepository.__init__.copies_store)
        monkeypatch.setattr(CachingConfigRepository, "load_config", CachingConfigRepository.load_config.unshared)
        monkeypatch.setattr(config_loader_impl, "create_defaults_list",
                            config_loader_impl.create_defaults_list.unremembered)
        monkeypatch.setattr(loader, "_compose_config_from_defaults_list",
                            loader._compose_config_from_defaults_list.unremembered)
        monkeypatch.setattr(loader, "_embed_result_config", staticmethod(loader._embed_result_config.copying))
        monkeypatch.setattr(defaults_list, "_create_interpolation_map", defaults_list._create_interpolation_map.always)
        monkeypatch.setattr(omegaconf_base, "parse", omegaconf_private._unmemoised_parse)
        monkeypatch.setattr(OverridesParser, "parse_rule", OverridesParser.parse_rule.unkept)
        monkeypatch.setattr(hydra_private, "lighter_compositions", lambda: None)

    return as_is


def state(cfg) -> tuple:
    """Everything a config holds, compared by value: each node's type, metadata (flags, its
    object and key types, its key), value and whether its parent is the node holding it, but two
    caches: the values its resolvers cached (``now``: the second the composition ran) and each
    node's memo of its flags. Not a pickle: equal strings that happen to be one object in one
    config and two in another pickle differently, and a pickle writes a typed container's
    ``Dict[str, int]`` as ``Dict`` (OmegaConf's ``__getstate__``), which is compared here."""
    OmegaConf.clear_cache(cfg)

    def canonical(node, parent) -> tuple:
        own = {key: value for key, value in node.__dict__.items() if key not in ("_content", "_parent", "_flags_cache")}
        own["_metadata"] = sorted(vars(own["_metadata"]).items())
        content = node.__dict__.get("_content")
        if isinstance(content, dict):
            content = tuple((repr(key), canonical(child, node)) for key, child in content.items())
        elif isinstance(content, list):
            content = tuple(canonical(child, node) for child in content)
        return type(node).__name__, repr(sorted(own.items())), node._parent is parent, repr(content) if isinstance(content, str) or content is None else content

    return canonical(cfg, None)


def test_a_composition_is_the_one_hydra_makes_each_time(hydra_as_is, monkeypatch):
    """Each config text loaded anew (none cached), then from the cache, against Hydra's own loading
    (the hydra node included: Hydra's own structured configs, the runtime's config sources)."""
    overrides = ["task=uea", "model=attention_bn", "experiment=primal_dual/table1"]
    monkeypatch.setattr(omegaconf_private, "_loaded", {})
    lighter = [state(compose_unchecked(overrides, with_hydra=True)) for _ in range(2)]
    assert omegaconf_private._loaded   # the second composition read the files from the cache
    hydra_as_is()
    assert lighter == [state(compose_unchecked(overrides, with_hydra=True))] * 2


def test_a_loaded_config_is_the_callers_own(tmp_path):
    """What Hydra edits in a loaded config (it pops ``defaults``, merges into it) is never seen by a
    later load of the same text, which is the config OmegaConf loads."""
    hydra_private.lighter_compositions()
    path = tmp_path / "option.yaml"
    path.write_text("defaults:\n  - base\nd_model: 8\nlayers: [{heads: 2}]\npath: ${oc.env:HOME}\n")
    first = OmegaConf.load(path)
    first.pop("defaults")
    first.layers[0].heads = 4
    first.merge_with({"extra": 1})
    assert state(OmegaConf.load(path)) == state(OmegaConf.load.uncached(path))
    with open(path, encoding="utf-8") as f:  # as Hydra's config sources read it: from an open file
        assert state(OmegaConf.load(f)) == state(OmegaConf.load.uncached(path))


def test_an_edited_or_new_config_file_is_never_served_stale(tmp_path):
    """The same path, size and time stamps with another text: the new text's config; a file added
    after a composition: found."""
    hydra_private.lighter_compositions()
    option = tmp_path / "experiment" / "stale_check.yaml"
    option.parent.mkdir()
    option.write_text("# @package _global_\nseed: 1\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    assert compose_unchecked([searchpath, "experiment=stale_check"]).seed == 1
    stamp = os.stat(option)
    option.write_text("# @package _global_\nseed: 2\n")
    os.utime(option, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert compose_unchecked([searchpath, "experiment=stale_check"]).seed == 2
    (option.parent / "stale_new.yaml").write_text("# @package _global_\nseed: 3\n")
    assert compose_unchecked([searchpath, "experiment=stale_new"]).seed == 3


def test_a_config_text_is_read_again_unless_its_file_is_unchanged_since_a_settled_read(tmp_path, monkeypatch):
    """source_fingerprint's digests: a file changed within SETTLED_S of a read is read at each
    fingerprint (a write in the same clock tick keeps its time stamps); one read SETTLED_S after its
    last change is not read again until its size, times or inode change."""
    from bench_cli.config import source_fingerprint

    config = tmp_path / "a.yaml"
    config.write_text("a: 1\n")
    reads = []
    read = source_fingerprint._read
    monkeypatch.setattr(source_fingerprint, "_read", lambda path: reads.append(path) or read(path))
    monkeypatch.setattr(source_fingerprint, "SETTLED_S", 3600.0)  # just written, however slow the machine
    first = source_fingerprint.folder_digest(tmp_path)
    assert source_fingerprint.folder_digest(tmp_path) == first and len(reads) == 2  # read each time
    monkeypatch.setattr(source_fingerprint, "SETTLED_S", -60.0)  # as if every read came a minute after the write
    assert source_fingerprint.folder_digest(tmp_path) == first and len(reads) == 3
    assert source_fingerprint.folder_digest(tmp_path) == first and len(reads) == 3  # settled: not read again
    config.write_text("a: 22\n")  # another size
    second = source_fingerprint.folder_digest(tmp_path)
    assert second != first and len(reads) == 4
    replacement = tmp_path / "b.txt"  # the same size, another inode (an editor's save)
    replacement.write_text("a: 33\n")
    replacement.replace(config)
    assert source_fingerprint.folder_digest(tmp_path) not in (first, second) and len(reads) == 5


def refusals(folder, text: str, hydra_as_is) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """An experiment ``text`` in ``folder``: (OmegaConf's error loading it, or '' when it loads; the
    one-line refusal of its composition) twice, made lighter, then as Hydra and OmegaConf make them."""
    hydra_private.lighter_compositions()
    option = folder / "experiment" / "probe.yaml"
    option.parent.mkdir()
    option.write_text(text)
    overrides = [f"hydra.searchpath=[file://{folder}]", "experiment=probe"]
    errors = []
    for as_is in (False, False, True):
        if as_is:
            hydra_as_is()
        try:
            OmegaConf.load(option)
            loading = ""
        except yaml.YAMLError as e:
            loading = str(e)
        with pytest.raises(UserError) as refused:
            compose_unchecked(overrides)
        errors.append((loading, str(refused.value)))
    return errors[:2], errors[2]


def test_a_yaml_error_is_raised_each_time_as_omegaconf_raises_it(tmp_path, hydra_as_is):
    """A duplicate key is OmegaConf's error, naming the file and line, every time it is loaded
    (a text that fails is not kept), and one line of `attnbench` as before."""
    lighter, (loading, refused) = refusals(tmp_path, "# @package _global_\nseed: 1\nseed: 2\n", hydra_as_is)
    assert lighter == [(loading, refused)] * 2 and "duplicate key" in loading
    assert f"{tmp_path / 'experiment' / 'probe.yaml'}, line 3" in refused and "duplicate key seed" in refused


def test_each_composition_shares_the_config_store_and_copies_the_rest():
    """A composition's repository reads Hydra's one ConfigStore (not a copy of it), and its other
    sources are copies (``hydra.searchpath`` re-initialises them, never Hydra's own), as Hydra's
    ``CachingConfigRepository.__init__`` sets them."""
    from hydra._internal.config_repository import CachingConfigRepository
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    from bench_cli.config.session import composer

    with composer():
        repository = GlobalHydra.instance().hydra.config_loader.repository
        caching = CachingConfigRepository(repository)
        hydras = object.__new__(CachingConfigRepository)
        CachingConfigRepository.__init__.copies_store(hydras, repository)
    assert vars(caching).keys() == vars(hydras).keys() and caching.cache == hydras.cache == {}
    sources, own = caching.delegate.get_sources(), repository.get_sources()
    assert [repr(s) for s in sources] == [repr(s) for s in own] == [repr(s) for s in hydras.delegate.get_sources()]
    assert caching.delegate is not repository and sources is not own
    stores = [s.store for s in sources if hasattr(s, "store")]
    assert len(stores) == 1 and stores[0] is ConfigStore.instance()
    assert all(s is not o for s, o in zip(sources, own))


# Config choices shared and not: values that differ, the same choices in another order, an added
# key, a group removed, Hydra's own groups and an experiment (its defaults list is its own). The
# default choices come right after another model's: the root config's load result, shared between
# compositions, must not keep the model that composition chose.
REMEMBERED = [["task=uea", "model=attention_bn", "seed=1"], [], ["model=attention_bn", "task=uea", "seed=2"],
              ["task=uea", "model=attention_bn", "+probe=3", "trainer.max_epochs=2"], ["task=uea", "model=softmax"],
              ["~logger", "seed=4"], ["hydra/launcher=joblib", "seed=5"], ["hydra/launcher=joblib"],
              ["experiment=primal_dual/table1", "seed=6"], ["experiment=primal_dual/table1"]]


def test_remembered_compositions_are_the_ones_hydra_makes(hydra_as_is, monkeypatch):
    """Each override list composed twice with the defaults lists, merges and config loads remembered
    (the first time from what an earlier list of the same choices left, the merge from a copy of
    the Hydra part an earlier merge left; the second from the memo alone), and what the caller
    changes in a composition is not seen by the next: then as Hydra composes each."""
    monkeypatch.setattr(hydra_private, "_defaults_lists", {})
    monkeypatch.setattr(hydra_private, "_merged", {})
    monkeypatch.setattr(hydra_private, "_hydra_parts", {})
    monkeypatch.setattr(hydra_private, "_load_results", {})
    remembered = []
    for overrides in REMEMBERED * 2:
        cfg = compose_unchecked(overrides, with_hydra=True)
        remembered.append(state(cfg))
        cfg.seed, cfg.task.name = 99, "changed by the caller"
    # seed, +probe and trainer.max_epochs choose nothing (the same choices in another order are
    # remembered apart: Hydra reads choices in their order); task=uea model=softmax are the default
    # choices, so that list's defaults are those of []: one merge for both
    assert (len(hydra_private._defaults_lists), len(hydra_private._merged)) == (len(REMEMBERED) - 3, len(REMEMBERED) - 5)
    # every merge but the first of each launcher started from a copy of the merged Hydra part
    assert len(hydra_private._hydra_parts) == 2
    hydra_as_is()
    assert remembered == [state(compose_unchecked(overrides, with_hydra=True)) for overrides in REMEMBERED] * 2


def test_a_structured_config_stored_again_is_composed_anew():
    """Hydra's ConfigStore is part of what a composition reads: a node stored again under the same
    name (a plugin's schema, a launcher's config) is what the next composition takes."""
    from hydra.core.config_store import ConfigStore

    hydra_private.lighter_compositions()
    for seed in (11, 12):
        ConfigStore.instance().store(group="experiment", name="stored_check", node={"seed": seed}, package="_global_")
        assert compose_unchecked(["experiment=stored_check"]).seed == seed


def test_a_remembered_composition_resolves_now_anew(monkeypatch):
    """Hydra's ``now`` is a cached resolver, resolved while a composition is made (hydra.run.dir
    holds the date): a composition of remembered choices resolves it again, as a new one does."""
    from hydra._internal import hydra as hydra_module

    hydra_private.lighter_compositions()
    monkeypatch.setattr(hydra_private, "_merged", {})
    ticks, setup_globals = iter(range(1000)), hydra_module.setup_globals

    def hydras_globals_then_a_clock_that_ticks() -> None:  # each Hydra made registers its own ``now``
        setup_globals()
        OmegaConf.register_new_resolver("now", lambda pattern: f"tick{next(ticks)}", use_cache=True, replace=True)

    monkeypatch.setattr(hydra_module, "setup_globals", hydras_globals_then_a_clock_that_ticks)
    try:
        run_dirs = [compose_unchecked(["seed=1"], with_hydra=True).hydra.run.dir for _ in range(3)]
    finally:
        setup_globals()  # Hydra's own resolvers again
    assert len(set(run_dirs)) == 3 and len(hydra_private._merged) == 1, run_dirs


def test_kept_configs_hand_out_independent_exact_copies():
    """Each copy is the config kept, node for node (a typed container's element type included, which
    a pickle writes without it), and the caller's own; a config holding what pickle refuses (an
    object under ``allow_objects``) is deep-copied instead."""
    from dataclasses import dataclass, field

    from bench_cli.config.kept_config import KeptConfig

    @dataclass
    class Typed:
        sizes: dict[str, int] = field(default_factory=lambda: {"a": 1})
        names: list[str] = field(default_factory=lambda: ["x"])

    typed = OmegaConf.create({"typed": Typed, "n": 1})
    for cfg in (typed, OmegaConf.create({"make": lambda: 1, "n": 1}, flags={"allow_objects": True})):
        kept = KeptConfig(cfg)
        first = kept.copy()
        assert state(first) == state(cfg) and first is not cfg
        first.n = 2
        assert kept.copy().n == 1 and cfg.n == 1
    assert str(KeptConfig(typed).copy().typed._get_node("sizes")._metadata.ref_type) == "typing.Dict[str, int]"


def test_an_interpolation_is_parsed_once_and_resolves_as_omegaconfs_own_parser_resolves_it(monkeypatch):
    """omegaconf_private.parse_each_interpolation_once: the same values as OmegaConf's parser gives
    (nested, relative, resolvers, defaults); a second resolution parses nothing again; a string that
    does not parse fails with OmegaConf's error each time, not kept."""
    from omegaconf import base
    from omegaconf.errors import GrammarParseError

    hydra_private.lighter_compositions()
    assert base.parse.__wrapped__ is omegaconf_private._unmemoised_parse
    values = {"a": 1, "b": "${a}", "c": "x-${b}-${oc.env:ATTNBENCH_NO_SUCH_VARIABLE,none}",
              "d": {"e": "${..a}", "f": "${oc.select:d.missing,7}", "g": "${oc.decode:'[1, ${a}]'}"}, "h": "${c}"}
    memoised = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    misses = base.parse.cache_info().misses
    again = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    assert base.parse.cache_info().misses == misses
    for _ in range(2):
        with pytest.raises(GrammarParseError, match="no viable alternative"):
            OmegaConf.to_container(OmegaConf.create({"a": 1, "x": "${a"}), resolve=True)
    monkeypatch.setattr(base, "parse", omegaconf_private._unmemoised_parse)
    assert memoised == again == OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    assert memoised["c"] == "x-1-none" and memoised["d"] == {"e": 1, "f": 7, "g": [1, 1]}


def test_an_override_is_parsed_once_and_each_caller_gets_its_own_copy_of_hydras_parse():
    """hydra_private.parse_each_override_once: the same Overrides as Hydra's parser makes (values,
    sweeps, deletions, additions, packages, quoted and escaped text, interpolations); a second
    parse of a text runs no parser and hands out another copy; a text with a grammar function is
    parsed each time (``shuffle`` draws a new order each time); a text that does not parse fails
    with Hydra's error each time."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    hydra_private.lighter_compositions()
    parser, hydras = OverridesParser.create(), OverridesParser.parse_rule.unkept
    texts = ["a=1", "a.b=x,y,z", "~a.b", "+a.b=[1, 2]", "++c={d: 1}", "model@hydra.x=softmax", "a='q,\\' r'",
             "a=${b.c}", "a=null", "a=1.5e3", "a/b=c", "seed=range(3)", "a=int(3)", "a=glob(*)"]
    once = parser.parse_overrides(texts)
    kept = hydra_private._parsed_overrides
    first = {text: kept[text] for text in texts if "(" not in text}
    again = parser.parse_overrides(texts)
    assert all(kept[text] is parse for text, parse in first.items())  # not parsed again
    assert not {text for text in texts if "(" in text} & set(kept)
    assert once == again == [hydras(parser, text, "override") for text in texts]
    assert all(a is not b and (a._value is not b._value or not isinstance(a._value, (list, dict)))
               for a, b in zip(once, again))
    for parsed in again:  # a caller's changes reach no later parse
        parsed.key_or_group, parsed.config_loader = "changed", object()
    assert parser.parse_overrides(texts) == once
    orders = {tuple(parser.parse_override("a=shuffle([1,2,3,4,5,6,7,8])").value()) for _ in range(20)}
    assert len(orders) > 1  # drawn anew at each parse, as Hydra's parser draws it
    for _ in range(2):
        with pytest.raises(OverrideParseException, match="no viable alternative at input '\\[1,'"):
            parser.parse_overrides(["a=[1,"])
    assert "a=[1," not in kept


def test_a_config_placed_twice_and_an_interpolated_default_compose_as_hydra_composes_them(tmp_path, hydra_as_is):
    """A config file named twice in one defaults list (under two packages, a config merged between
    the two placings that changes the first one's values), and a defaults entry interpolating a
    choice made before it: the first placing takes the composition's own copy as it is, the second
    a new one; the map of known choices is built for the interpolated entry."""
    hydra_private.lighter_compositions()
    files = {"probe/base.yaml": "value: 1\nnested:\n  a: [1, 2]\n", "probe/alt.yaml": "value: 2\n",
             "combo/alt.yaml": "combo: from-alt\n", "combo/base.yaml": "combo: from-base\n",
             "edit/first.yaml": "# @package _global_\nfirst:\n  value: 5\n  nested:\n    a: [7]\n",
             "experiment/twice.yaml": "# @package _global_\ndefaults:\n  - /probe@first: base\n  - /edit: first\n"
                                      "  - /probe@second: base\n  - /probe: alt\n  - /combo: ${probe}\n  - _self_\n"
                                      "third: ${first.value}\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "experiment=twice"]
    lighter = [state(compose_unchecked(overrides, with_hydra=True)) for _ in range(2)]
    cfg = compose_unchecked(overrides)
    assert (cfg.first.value, list(cfg.first.nested.a), cfg.second.value, list(cfg.second.nested.a)) == (5, [7], 1, [1, 2])
    assert (cfg.combo.combo, cfg.probe.value, cfg.third) == ("from-alt", 2, 5)
    hydra_as_is()
    assert lighter == [state(compose_unchecked(overrides, with_hydra=True))] * 2


def test_a_config_file_with_a_schema_of_its_name_composes_as_hydra_composes_it(tmp_path, hydra_as_is, monkeypatch):
    """A config file and a structured config stored under the same name (Hydra's automatic schema
    matching): Hydra replaces the loaded config by their merge, which is placed as Hydra places it
    (a deep copy), not as the composition's own copy; the loaded config is read only then."""
    from dataclasses import dataclass

    from hydra.core.config_store import ConfigStore

    @dataclass
    class ProbeSchema:
        value: int = 0
        label: str = "schema"

    monkeypatch.setattr(ConfigStore.instance(), "repo", copy.deepcopy(ConfigStore.instance().repo))  # restored after
    ConfigStore.instance().store(group="schema_probe", name="matched", node=ProbeSchema)
    hydra_private.lighter_compositions()
    for name, text in {"schema_probe/matched.yaml": "value: 3\n",
                       "experiment/schema_twice.yaml": "# @package _global_\ndefaults:\n  - /schema_probe@first: matched\n"
                                                       "  - /schema_probe@second: matched\n  - _self_\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "experiment=schema_twice"]  # placed twice
    with pytest.warns(UserWarning, match="schema"):  # Hydra's deprecation warning of the matching
        lighter = [state(compose_unchecked(overrides, with_hydra=True)) for _ in range(2)]
        cfg = compose_unchecked(overrides)
    assert [(cfg[p].value, cfg[p].label) for p in ("first", "second")] == [(3, "schema")] * 2
    hydra_as_is()
    with pytest.warns(UserWarning, match="schema"):
        assert lighter == [state(compose_unchecked(overrides, with_hydra=True))] * 2


def test_a_merge_error_after_the_hydra_part_is_hydras_error(tmp_path, hydra_as_is):
    """A config that cannot merge into what came before it (a list where the root config has a
    table), merged after a copy of the Hydra part: Hydra's exception with OmegaConf's reason, naming
    the file, each time."""
    lighter, (loading, refused) = refusals(tmp_path, "# @package _global_\ntrainer: [1, 2]\n", hydra_as_is)
    assert lighter == [("", refused)] * 2 and loading == ""
    assert "In 'experiment/probe': ConfigTypeError" in refused and "Cannot merge DictConfig with ListConfig" in refused
