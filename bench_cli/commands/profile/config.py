"""The ``profile`` config group of `attnbench profile`: composed on demand, checked before anything
is built (one-line UserErrors)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from bench_cli.config import compose
from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.commands.profile.settings import int_list

MODES = ("task", "pba")
SDPA_BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")


def profile_overrides(overrides: list[str]) -> list[str]:
    """Select the ``profile`` config group: ``profile=NAME`` (or none: ``default``).

    The group is not in the root defaults list (so training runs and their config hashes do
    not carry profile keys); it is appended (``+profile=NAME``) unless a future root config
    lists it, in which case ``profile=NAME`` is passed as is.
    """
    listed = _root_lists_profile()
    chosen, rest = None, []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key.lstrip("+") == "profile":
            chosen = value
        else:
            rest.append(o)
    chosen = chosen or "default"
    options = compose.group_options("profile")
    if chosen not in options:
        raise unknown_choice("profile", chosen, options)
    return [f"{'' if listed else '+'}profile={chosen}", *rest]


def _root_lists_profile() -> bool:
    root = OmegaConf.load(compose.conf_dir() / f"{compose.CONFIG_NAME}.yaml")
    for entry in root.get("defaults", []) or []:
        if isinstance(entry, (dict, DictConfig)) and any(str(k).split()[-1] == "profile" for k in entry):
            return True
    return False


def load_config(args: list[str]) -> DictConfig:
    """Compose conf/ for ``attnbench profile`` from command-line overrides; validate it."""
    cfg = compose.compose(profile_overrides(args))
    validate(cfg)
    return cfg


def _choice(p: DictConfig, key: str, choices) -> str:
    value = str(p.get(key))
    if value not in choices:
        raise unknown_choice(f"profile.{key}", value, choices)
    return value


def validate(cfg: DictConfig) -> None:
    """One-line UserErrors for every bad profile setting, before anything is built."""
    p = cfg.profile
    mode = _choice(p, "mode", MODES)
    int_list(p, "seq_lens")
    int_list(p, "d_models", allow_null=True)
    if not isinstance(p.batch_size, int) or p.batch_size < 1:
        raise UserError(f"profile.batch_size must be a positive integer, got {p.batch_size!r}")
    backends = p.sdpa_backends
    if isinstance(backends, str):
        with open_dict(p):
            p.sdpa_backends = backends = [backends]
    if not backends:
        raise UserError("profile.sdpa_backends is empty; valid: " + ", ".join(SDPA_BACKENDS))
    for b in backends:
        if str(b) not in SDPA_BACKENDS:
            raise unknown_choice("profile.sdpa_backends entry", str(b), SDPA_BACKENDS)
    _choice(p, "flops", ("meta", "real", "off"))
    _choice(p, "memory", ("auto", "fake", "real", "off"))
    budget = p.get("memory_budget_gb")
    if budget is not None and budget != "auto" and not (isinstance(budget, (int, float)) and budget > 0):
        raise UserError(f"profile.memory_budget_gb must be a positive number, auto or null, got {budget!r}")
    timeout = p.get("timeout_s")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise UserError(f"profile.timeout_s must be a positive number of seconds or null, got {timeout!r}")
    t = p.timing
    for key in ("warmup", "repeats"):
        if not isinstance(t.get(key), int) or t.get(key) < (1 if key == "repeats" else 0):
            raise UserError(f"profile.timing.{key} must be an integer >= {1 if key == 'repeats' else 0}, got {t.get(key)!r}")
    int_list(t, "d_models", allow_null=True)
    int_list(t, "seq_lens", allow_null=True)
    for b in t.get("sdpa_backends") or []:
        if str(b) not in SDPA_BACKENDS:
            raise unknown_choice("profile.timing.sdpa_backends entry", str(b), SDPA_BACKENDS)
    if not isinstance(t.get("optimizer"), bool):
        raise UserError(f"profile.timing.optimizer must be true or false, got {t.get('optimizer')!r}")
    for key in ("scheduler",):
        if not isinstance(t.get(key, False), bool):
            raise UserError(f"profile.timing.{key} must be true or false, got {t.get(key)!r}")
    steps = t.get("steps_per_round", 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise UserError(f"profile.timing.steps_per_round must be an integer >= 1, got {steps!r}")
    _validate_regime(cfg)
    budget_s = t.get("budget_s", 0)
    if not isinstance(budget_s, (int, float)) or isinstance(budget_s, bool) or budget_s < 0:
        raise UserError(f"profile.timing.budget_s must be a number of seconds >= 0, got {budget_s!r}")
    eval_batches = t.get("eval_batches_per_1k_steps")
    if not isinstance(eval_batches, int) or isinstance(eval_batches, bool) or eval_batches < 0:
        raise UserError(f"profile.timing.eval_batches_per_1k_steps must be an integer >= 0, got {eval_batches!r}")
    if mode == "pba":
        from bench_cli.commands.reproduce.pba import validate as validate_pba

        validate_pba(p)
        return
    models = compose.group_options("model")
    baseline = cfg.get("baseline")
    if baseline is not None and str(baseline) not in models:
        raise unknown_choice("baseline model", str(baseline), models)
    fused = p.get("fused_baseline")
    if fused is not None and str(fused) not in models:
        raise unknown_choice("profile.fused_baseline", str(fused), models)
    for m in p.get("models") or []:
        if str(m) not in models:
            raise unknown_choice("profile.models entry", str(m), models)
    if len(p.get("models") or []) > 1 and p.get("plot") not in (None, "auto"):
        raise UserError("profile.plot: several profile.models need plot=auto (one figure per model) or null")
    tasks = compose.group_options("task")
    for entry in p.get("tasks") or []:
        if not isinstance(entry, DictConfig) or str(entry.get("task")) not in tasks:
            raise unknown_choice("profile.tasks entry's task", str(entry.get("task") if isinstance(entry, DictConfig)
                                                                   else entry), tasks)
    from bench_cli.commands.profile.paper_table import validate as validate_paper

    validate_paper(p.get("paper"))
    heads = int(cfg.task.backbone.n_heads) if "backbone" in cfg.task and "n_heads" in cfg.task.backbone else None
    for d in int_list(p, "d_models", allow_null=True) or []:
        if "backbone" not in cfg.task or "d_model" not in cfg.task.backbone:
            raise UserError(f"task '{cfg.task.name}' has no task.backbone.d_model to sweep; set profile.d_models=null")
        if heads and d % heads:
            raise UserError(f"profile.d_models: {d} is not divisible by task.backbone.n_heads={heads}")


def _validate_regime(cfg: DictConfig) -> None:
    """profile.regime's keys and trainer.precision, checked as a run checks them."""
    from bench_cli.engine.env import PRECISIONS

    precision = str(cfg.trainer.get("precision", "32"))
    if precision not in PRECISIONS:
        raise unknown_choice("trainer.precision", precision, PRECISIONS)
    regime = cfg.profile.get("regime") or {}
    for key in regime:
        if key not in ("attention_float32", "checkpoint_attention", "memory_over_timed_steps"):
            raise UserError(f"unknown key profile.regime.{key}; valid: attention_float32, checkpoint_attention, "
                            "memory_over_timed_steps")
    for key in ("attention_float32", "memory_over_timed_steps"):
        if not isinstance(regime.get(key, False), bool):
            raise UserError(f"profile.regime.{key} must be true or false, got {regime.get(key)!r}")
    names = regime.get("checkpoint_attention") or []
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise UserError(f"profile.regime.checkpoint_attention must be a list of attention names, got {names!r}")
