"""Every config composes, and every task x model preset builds and takes a training step
(lightning-hydra-template style): tiny shapes, the real code paths."""
from __future__ import annotations

import functools

import pytest
import torch
from omegaconf import OmegaConf

from bench_cli.config.compose import compose, group_options, load_option
import fresh_interpreter
from conftest import causal_config, composed, with_model
from bench_cli.core.errors import UserError
from bench_cli.config.taskfit import build_task, check_model_fits_task
from bench_cli.commands.validate import check_model_builds
from attnbench.models.attention import collect_auxiliary_loss
from attnbench.models.roles import capability_problems, layer_attention_configs

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny shapes: 2 threads only spin on a busy machine

TASKS = group_options("task")
MODELS = group_options("model")
# Tasks whose paper-size model is too big for a smoke step on 2 cores: smaller widths, same code.
SMALL = {"nmt": ["task.backbone.d_model=32", "task.backbone.d_ff=64", "task.vocab_size=64"]}


def test_groups_are_not_empty():
    assert "uea" in TASKS and {"softmax", "attention_bn_sh", "super", "primalformer", "primal_plus"} <= set(MODELS)


@functools.cache
def smoke_overrides(task: str) -> tuple[str, ...]:
    """The task's overrides for a smoke step: SMALL, and 16 per head where the paper-size width is
    slow here. Composed once per task (a composition costs about 0.3 s), not once per model."""
    overrides = (f"task={task}", *SMALL.get(task, []))
    backbone = composed(overrides).task.get("backbone") or {}
    if backbone.get("d_model", 0) > 128:
        width = 16 * int(backbone.get("n_heads") or 4)
        overrides += (f"task.backbone.d_model={width}", f"task.backbone.d_ff={2 * width}")
    return overrides


def task_with_model(task: str, model: str):
    """The task's smoke config composed once, with the model group's option put in its place
    (conftest.with_model): what Hydra composes for `task=... model=...`."""
    return with_model(composed(smoke_overrides(task)), model)


@pytest.mark.parametrize("model", MODELS)
def test_model_options_compose_as_loaded(model):
    composed = compose([f"model={model}"]).model
    assert OmegaConf.to_container(composed) == OmegaConf.to_container(load_option("model", model))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("task", TASKS)
def test_task_model_preset_builds_and_trains_one_step(task, model):
    cfg = task_with_model(task, model)
    assert cfg.model.name == model and cfg.task.name == task
    t = build_task(cfg)
    if capability_problems(cfg.model, t.attention_stacks(), t.requires):  # e.g. a non-causal variant, causal task
        with pytest.raises(UserError) as refused:  # refused before anything is built, in one line
            check_model_fits_task(t, cfg)
        assert "\n" not in str(refused.value) and "cannot run task" in str(refused.value)
        return
    check_model_fits_task(t, cfg)
    stacks = t.attention_stacks()
    if "decoder" in stacks and any(c.get("data_dependent") for c in layer_attention_configs(cfg.model, stacks["decoder"], "decoder")):
        # causal Primal-Attention needs data-independent weights (Listing 1): refused in one line,
        # runs once the experiment's per_dataset table says so
        with pytest.raises(UserError, match="data_dependent=false"):
            check_model_builds(t, cfg)
        cfg = causal_config(smoke_overrides(task), model, cfg.task.dataset)
        t = build_task(cfg)
    seq_len = 16
    t.setup_synthetic(seq_len)
    net = t.build_model(cfg.model)
    batch = t.synthetic_batch(2, seq_len)
    loss = t.loss(net(**t.model_inputs(batch)), batch)
    if cfg.model.get("eta"):
        j = collect_auxiliary_loss(net)
        assert j is not None and torch.isfinite(j), "a model with eta must expose its KSVD loss"
        loss = loss + cfg.model.eta * j
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize("group", ["trainer", "logger", "paths"])
def test_other_groups_compose(group):
    options = group_options(group)
    assert options
    for option in options:
        cfg = compose([f"{group}={option}"])
        assert OmegaConf.to_container(cfg[group]) == OmegaConf.to_container(load_option(group, option)), option


@pytest.mark.xdist_group(fresh_interpreter.GROUP)
def test_task_discovery_imports_no_family_dependency():
    """Every family package is imported to register its tasks; their heavy dependencies (and the
    text family's models) must load only when the family runs (DESIGN.md: everything heavy is
    optional and lazy). Asked of a fresh interpreter (tests/fresh_interpreter.py)."""
    from attnbench.tasks import available_tasks

    answers = fresh_interpreter.report()
    assert answers["registered"] == available_tasks() and "vit" in answers["registered"]
    assert answers["heavy"] == []


def test_every_task_config_names_a_registered_task():
    from attnbench.tasks import available_tasks

    assert sorted(compose([f"task={t}"]).task.name for t in TASKS) == available_tasks()


# --- every defaults-list form that selects an experiment's task (each must be read as Hydra reads it) ----
# experiment/forms/<name>.yaml bodies (after `# @package _global_`), each selecting a task other than
# the root default (uea) the way Hydra's defaults list allows: parents by absolute, relative and
# `@package` config entries and by experiment group entries, task entries with optional/override/
# `@package`/list forms, precedence between a file and its parents, sweeps before and after _self_.
DEFAULTS_FORMS = {
    "base": "defaults:\n  - override /task: lra_listops\n",
    "swept": "defaults:\n  - /experiment/forms/base\nhydra:\n  sweeper:\n    params:\n      task: lra_text,lra_image\n",
    "sub/sibling": "defaults:\n  - override /task: lm\n",
    "sub/nested": "defaults:\n  - sibling\n",     # a config entry's relative entries start in its folder
    "absolute_parent": "defaults:\n  - /experiment/forms/base\n",
    "absolute_parent_here": "defaults:\n  - /experiment/forms/base@_here_\n",
    "relative_parent_global": "defaults:\n  - forms/base@_global_\n",
    "nested_parent": "defaults:\n  - forms/sub/nested\n",
    "group_parent": "defaults:\n  - /experiment/forms/sub: sibling\n",
    "relative_group_parent": "defaults:\n  - forms/sub@_here_: [sibling]\n",
    "optional_override": "defaults:\n  - optional override /task: d4rl\n",
    "override_at_task": "defaults:\n  - override /task@task: d4rl\n",
    "override_at_global_task": "defaults:\n  - override /task@_global_.task: d4rl\n",
    "override_list": "defaults:\n  - override /task: [d4rl]\n",
    "own_override_wins": "defaults:\n  - forms/base\n  - override /task: tser\n",
    "last_parent_wins": "defaults:\n  - forms/base\n  - forms/sub/nested\n",
    "sweep_self_last": "defaults:\n  - forms/swept\n  - _self_\nhydra:\n  sweeper:\n    params:\n      task: lm\n",
    "sweep_self_first": "defaults:\n  - _self_\n  - forms/swept\nhydra:\n  sweeper:\n    params:\n      task: lm\n",
    "plain_task": "defaults:\n  - /task: lm\n",   # Hydra: "Multiple values for task" (the root has one)
}
PARENTS_ONLY = ("base", "swept", "sub/sibling", "sub/nested", "plain_task")   # composed only as parents (0.5 s a composition)


@pytest.fixture
def defaults_forms(tmp_path, monkeypatch):
    """A --config-dir with experiment/forms/* (DEFAULTS_FORMS); the config folders restored afterwards."""
    from bench_cli.config import checks, keys, search_path

    monkeypatch.setattr(search_path, "_CONFIG_DIRS", [])
    for name, body in DEFAULTS_FORMS.items():
        path = tmp_path / "experiment" / "forms" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# @package _global_\n" + body)
    search_path.add_config_dir(tmp_path)
    yield [f"forms/{name}" for name in DEFAULTS_FORMS if name not in PARENTS_ONLY]
    keys._top_level_keys.cache_clear()
    checks._group_defaults.cache_clear()


def test_experiment_tasks_read_every_defaults_form_as_hydra_composes_it(defaults_forms):
    from bench_cli.config import compose as composition

    with composition.composer() as compose_one:
        for name in defaults_forms:
            cfg = compose_one([f"experiment={name}"], with_hydra=True)
            swept = OmegaConf.select(cfg, "hydra.sweeper.params.task")
            hydra_tasks = {cfg.task.name, *(t.strip() for t in str(swept).split(",") if swept)}
            assert composition.experiment_tasks(name) == sorted(hydra_tasks), name
            assert hydra_tasks != {"uea"}, name   # each form selects something
        with pytest.raises(UserError, match="Multiple values for task"):
            compose_one(["experiment=forms/plain_task"])
    assert composition.experiment_tasks("forms/plain_task") == ["lm"]   # what it asks for: the error names it
