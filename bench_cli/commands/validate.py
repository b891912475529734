"""One validation of a composed config, used by `validate`, `run` and every job of a `sweep`
before anything is trained: settings in range, the task's data present (nothing read), the model's
attentions able to fill the task's roles, and the model buildable. Each problem is one line
(UserError, exit status 2). The protocol is checked against the ones the task declares
(``Task.protocols``), ``task.paper_selection`` against best | last, and the data by the task's fetcher
(``Task.check_data``).

What the config asks of the machine it runs on (CUDA, fp16, a GPU per process) is not the
config's to check: bench_cli/engine/env.py ``check_hardware`` says what it is. `run` and
`validate` check it here (``hardware=True``: the run is on this machine); a sweep's plan does
not, each job checks it where its launcher runs it (a failed record, the sweep goes on).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bench_cli.core.errors import UserError, first_line, unknown_choice
from bench_cli.core.files import unwritable_folder
from bench_cli.results.csv_store import check_results_path


SEED_MAX = 2**32 - 1


def _number(cfg, key: str, *, minimum=None, maximum=None, integer=False, optional=False, exclusive=False):
    value = OmegaConf.select(cfg, key, default=None)
    if value is None:
        if optional:
            return None
        raise UserError(f"{key} is required")
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise UserError(f"bad value for {key}: {value!r} (expected {'an integer' if integer else 'a number'})")
    low_ok = minimum is None or (value > minimum if exclusive else value >= minimum)
    if not low_ok or (maximum is not None and (value >= maximum if exclusive else value > maximum)):
        if maximum is not None:
            bounds = f"strictly between {minimum} and {maximum}" if exclusive else f"between {minimum} and {maximum}"
        else:
            bounds = f"greater than {minimum}" if exclusive else f"of at least {minimum}"
        raise UserError(f"bad value for {key}: {value!r} (expected {'an integer ' if integer else 'a number '}{bounds})")
    return value


def check_settings(cfg: DictConfig) -> None:
    """Ranges and choices of the trainer and task settings every run reads."""
    from bench_cli.engine.optim import OPTIMIZERS, SCHEDULERS
    from bench_cli.engine.env import check_device_name
    from attnbench.tasks import task_class

    t = cfg.trainer
    protocol = str(cfg.task.get("protocol", "holdout"))
    task_type = task_class(str(cfg.task.name))
    task_type.check_protocol(protocol)
    task_type.paper_selection(cfg.task)
    _number(cfg, "seed", minimum=0, maximum=SEED_MAX, integer=True)  # NumPy's RandomState takes 32 bits
    _number(cfg, "task.split_seed", minimum=0, maximum=SEED_MAX, integer=True, optional=True)
    _number(cfg, "trainer.max_epochs", minimum=1, integer=True, optional=bool(t.get("max_steps")))
    _number(cfg, "trainer.max_steps", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.step_budget", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.batch_size", minimum=1, integer=True)
    _number(cfg, "trainer.eval_batch_size", minimum=1, integer=True)
    _number(cfg, "trainer.micro_batch_size", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.accumulate_grad_batches", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.eval_every_epochs", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.eval_every_steps", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.num_workers", minimum=0, integer=True, optional=True)
    _number(cfg, "trainer.num_threads", minimum=1, integer=True, optional=True)
    _number(cfg, "trainer.grad_clip", minimum=0, optional=True, exclusive=True)
    _number(cfg, "trainer.optimizer.lr", minimum=0, exclusive=True)
    _number(cfg, "trainer.early_stopping.patience", minimum=1, integer=True, optional=True)
    if str(t.optimizer.name) not in OPTIMIZERS:
        raise unknown_choice("trainer.optimizer.name", t.optimizer.name, OPTIMIZERS)
    if str(t.scheduler.name) not in SCHEDULERS:
        raise unknown_choice("trainer.scheduler.name", t.scheduler.name, SCHEDULERS)
    from bench_cli.engine.trainer import train_metrics_source

    train_metrics_source(t.get("train_metrics", "none"))
    check_device_name(str(t.device))
    from bench_cli.engine.distributed import STRATEGIES
    from bench_cli.engine.env import PRECISIONS

    if str(t.get("strategy", "none")) not in STRATEGIES:
        raise unknown_choice("trainer.strategy", t.strategy, STRATEGIES)
    precision = str(t.get("precision", "32"))
    if precision not in PRECISIONS:
        raise unknown_choice("trainer.precision", precision, PRECISIONS)
    if precision == "fp16" and str(t.device).split(":")[0] == "cpu":  # on any machine (auto may be a GPU: the job's)
        raise UserError("trainer.precision=fp16 needs CUDA (autocast + GradScaler); on the CPU use 32 or bf16")
    _number(cfg, "trainer.optimizer.lr_reference_batch", minimum=1, optional=True)
    _number(cfg, "trainer.scheduler.warmup_epochs", minimum=0, integer=True, optional=True)
    from bench_cli.engine.checkpoint import check_root as check_checkpoint_root

    check_checkpoint_root(cfg)  # trainer.checkpoint and trainer.resume, and that checkpoints can be written
    check_results_path(cfg.results.path)
    output = OmegaConf.select(cfg, "paths.output_dir", default=None)
    blocked = unwritable_folder(output) if output is not None else None
    if blocked is not None:
        raise UserError(f"paths.output_dir={output}: cannot write in {blocked} (read-only or not a folder); "
                        f"choose another paths.output_dir=DIR")
    check_model_sizes(cfg)
    if protocol == "holdout" and OmegaConf.select(cfg, "task.val_fraction", default=None) is not None:
        _number(cfg, "task.val_fraction", minimum=0, maximum=1, exclusive=True)
    _number(cfg, "task.test_fraction", minimum=0, maximum=1, exclusive=True, optional=True)
    # rollouts (d4rl): an evaluation of no episode has no return to select or report
    _number(cfg, "task.eval.test_episodes", minimum=1, integer=True, optional=True)
    if protocol == "holdout":
        _number(cfg, "task.eval.val_episodes", minimum=1, integer=True, optional=True)


BACKBONE_SIZES = ("d_model", "n_heads", "n_layers", "n_encoder_layers", "n_decoder_layers", "d_ff")


def check_model_sizes(cfg: DictConfig) -> None:
    """The backbone's sizes and the task's length: integers of at least 1, heads dividing d_model
    (a 0 or a negative size would fail deep inside the model's first forward)."""
    for name in BACKBONE_SIZES:
        _number(cfg, f"task.backbone.{name}", minimum=1, integer=True, optional=True)
    _number(cfg, "task.max_len", minimum=1, integer=True, optional=True)
    d_model = OmegaConf.select(cfg, "task.backbone.d_model", default=None)
    heads = OmegaConf.select(cfg, "task.backbone.n_heads", default=None)
    if isinstance(d_model, int) and isinstance(heads, int) and d_model % heads:
        raise UserError(f"task.backbone.n_heads={heads} does not divide task.backbone.d_model={d_model} "
                        "(each head gets d_model / n_heads)")


def check_config(cfg: DictConfig, build: bool = False, recorded: bool = False, hardware: bool = True):
    """Check ``cfg`` before a run; returns the task (not set up). With ``build``, also build the
    model on the task's synthetic shapes (no data read) to catch options the model refuses;
    ``recorded``: see check_model_builds. ``hardware``: the run is on this machine, so this
    machine must have what it asks (engine/env.check_hardware); a sweep's plan says False."""
    from bench_cli.config.taskfit import build_task, check_model_fits_task

    check_settings(cfg)
    if hardware:
        from bench_cli.engine.env import check_hardware

        check_hardware(cfg)
    task = build_task(cfg)
    task.check_dataset_name()  # the task's shapes may depend on the dataset (textcls' setups.<dataset>)
    check_model_fits_task(task, cfg)  # an impossible (task, attention) pair needs no data to be refused
    task.check_data()
    if build:
        check_model_builds(task, cfg, recorded)
    return task


def check_model_builds(task, cfg: DictConfig, recorded: bool = False) -> None:
    """Build the model on the task's synthetic shapes and run one tiny forward pass (skipped for
    tasks without synthetic shapes): options an attention refuses only when it runs (e.g. causal
    Primal-Attention with data-dependent weights) become one line too. Any other error of the
    forward (a broken kernel, an output of the wrong shape) is one line as well, unless
    ``recorded`` (`run`, a sweep's jobs): the run then meets it and records it as ``failed``."""
    import torch

    seq_len = int(OmegaConf.select(cfg, "task.max_len", default=None) or 16)
    try:
        task.setup_synthetic(seq_len)
    except NotImplementedError:
        return
    try:
        model = task.build_model(cfg.model)
        batch = task.synthetic_batch(1, seq_len)
        with torch.no_grad():
            model.eval()(**task.model_inputs(batch))
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot build model '{cfg.model.name}': {first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the model's own code failing, not a setting
        from bench_cli.core.errors import is_oom

        if is_oom(e):  # sizes that cannot fit: refused, never a row
            raise UserError(f"model '{cfg.model.name}' does not fit in memory at these sizes (one sample): "
                            f"{first_line(e)}") from None
        if not recorded:
            raise UserError(f"model '{cfg.model.name}' fails on a synthetic batch: {type(e).__name__}: "
                            f"{first_line(e)}") from None

