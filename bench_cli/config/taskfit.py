"""Whether a model preset can run a task, asked before anything is built (the sweep's planner, the
run and the zoo's report ask the same question): the task from its config, then every attention
role of the model against the registry's capabilities."""
from __future__ import annotations

from omegaconf import DictConfig

from bench_cli.core.errors import UserError


def build_task(cfg: DictConfig):
    from attnbench.tasks import task_class

    return task_class(cfg.task.name)(cfg.task, cfg.paths.data_root)


def check_model_fits_task(task, cfg: DictConfig) -> None:
    """Refuse impossible (task, attention) pairs before building anything: every attention role
    of the model (encoder, causal decoder, cross) against the registry's capabilities."""
    from attnbench.models.roles import capability_problems

    problems = capability_problems(cfg.model, task.attention_stacks(), task.requires)  # an unknown name: its line
    if problems:
        raise UserError(f"model '{cfg.model.name}' cannot run task '{cfg.task.name}': {'; '.join(problems)}")
