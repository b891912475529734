"""Optimisers and learning-rate schedules, by name, as the papers' code builds them.

The trainer asks for one of each (``trainer.optimizer``, ``trainer.scheduler``); the names and
their options are the ones the configs under conf/trainer and conf/experiment use.
"""
from __future__ import annotations

import math

import torch

from bench_cli.core.errors import unknown_choice


OPTIMIZERS = ("adam", "adamw", "radam", "rmsprop", "sgd", "keras_adam", "keras_adamw", "keras_rmsprop")
SCHEDULERS = ("none", "linear_warmup", "cosine", "step", "onecycle", "inverse_sqrt")


def parameter_groups(model: torch.nn.Module, weight_decay: float, no_decay_1d: bool = False):
    """The trainable parameters; with ``no_decay_1d`` (``optimizer.no_decay_1d``), timm's
    ``param_groups_weight_decay`` as DeiT uses it: 1-D parameters (norms, biases) and the names the
    model lists in ``no_weight_decay()`` (e.g. position embedding, cls token) get weight decay 0."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not no_decay_1d or not weight_decay:
        return [p for _, p in named]
    hook = getattr(model, "no_weight_decay", None)
    skip = set(hook()) if callable(hook) else set()
    plain = [p for n, p in named if p.ndim <= 1 or n.endswith(".bias") or n in skip]
    decayed = [p for n, p in named if not (p.ndim <= 1 or n.endswith(".bias") or n in skip)]
    return [{"params": plain, "weight_decay": 0.0}, {"params": decayed, "weight_decay": weight_decay}]


class _KerasOptimizer(torch.optim.Optimizer):
    """The step of a Keras 3 optimiser (keras/src/optimizers/base_optimizer.py ``apply``): decoupled
    weight decay first (``_apply_weight_decay``: variable - variable * weight_decay * lr, on every
    parameter given), then the subclass's ``update_step``. State is per parameter, as torch's."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["weight_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                self._update(p, p.grad, self.state[p], group)
        return loss

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


class KerasAdam(_KerasOptimizer):
    """Keras' Adam (keras/src/optimizers/adam.py; the same rule as tf.keras 2's): epsilon is the
    "epsilon hat" of Kingma & Ba (the formula before their Sec. 2.1),
        m <- m + (g - m)(1 - beta_1),  v <- v + (g^2 - v)(1 - beta_2),
        theta <- theta - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon);
    torch's Adam adds epsilon to sqrt(v / (1 - beta_2^t)) instead, i.e. Keras' rule with an epsilon
    of epsilon / sqrt(1 - beta_2^t), which changes every step (hence a class of its own). With
    ``weight_decay`` it is Keras' AdamW (keras/src/optimizers/adamw.py is Adam with a required
    weight_decay; defaults: learning rate 1e-3, beta_1 0.9, beta_2 0.999, epsilon 1e-7)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-7, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _update(self, p, grad, state, group):
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        beta_1, beta_2 = group["betas"]
        t = state["step"]
        state["exp_avg"].lerp_(grad, 1.0 - beta_1)
        state["exp_avg_sq"].mul_(beta_2).addcmul_(grad, grad, value=1.0 - beta_2)
        alpha = group["lr"] * math.sqrt(1.0 - beta_2**t) / (1.0 - beta_1**t)
        p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-alpha)


class KerasRMSprop(_KerasOptimizer):
    """Keras' RMSprop (keras/src/optimizers/rmsprop.py; tf.keras 2's training_ops.ApplyRMSProp
    alike): epsilon inside the square root,
        v <- rho v + (1 - rho) g^2,  increment = lr g / sqrt(v + epsilon)
    (centered: v - mean(g)^2 + epsilon), then theta <- theta - increment, or with ``momentum``
    mom <- momentum mom + increment, theta <- theta - mom. torch's RMSprop divides by
    sqrt(v) + epsilon: with epsilon 1e-7 Keras' denominator never falls below sqrt(1e-7) ~ 3.2e-4,
    torch's below 1e-7, so rarely updated rows (rare-word embeddings) step far further in torch.
    Defaults as Keras: learning rate 1e-3, rho 0.9, momentum 0, epsilon 1e-7, not centred;
    ``weight_decay`` decoupled as every Keras 3 optimiser's (torch's RMSprop adds it to the gradient)."""

    def __init__(self, params, lr: float = 1e-3, rho: float = 0.9, momentum: float = 0.0, eps: float = 1e-7,
                 centered: bool = False, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, rho=rho, momentum=momentum, eps=eps, centered=centered,
                                      weight_decay=weight_decay))

    def _update(self, p, grad, state, group):
        rho = group["rho"]
        if not state:
            state["square_avg"] = torch.zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = torch.zeros_like(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = torch.zeros_like(p)
        denominator = state["square_avg"].mul_(rho).addcmul_(grad, grad, value=1.0 - rho).clone()
        if group["centered"]:
            mean = state["grad_avg"].mul_(rho).add_(grad, alpha=1.0 - rho)
            denominator.addcmul_(mean, mean, value=-1.0)
        increment = grad.mul(group["lr"]).div_(denominator.add_(group["eps"]).sqrt_())
        if group["momentum"] > 0:
            increment = state["momentum_buffer"].mul_(group["momentum"]).add_(increment)
        p.sub_(increment)


def make_optimizer(params, cfg, lr_scale: float = 1.0) -> torch.optim.Optimizer:
    name, lr, wd = cfg.name, float(cfg.lr) * lr_scale, float(cfg.get("weight_decay", 0.0))
    betas = tuple(cfg.get("betas", (0.9, 0.999)))
    eps = float(cfg.get("eps", 1e-8) or 1e-8)  # the LRA PyTorch code uses AdamW eps 1e-6
    keras_eps = float(cfg.get("eps") or 1e-7)  # Keras' default epsilon
    makers = {
        "adam": lambda: torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "radam": lambda: torch.optim.RAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=float(cfg.get("momentum", 0.9)), weight_decay=wd),
        # torch's RMSprop with Keras' defaults (rho 0.9, no momentum); keras_rmsprop is Keras' rule
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr, alpha=float(cfg.get("rho", 0.9)), eps=eps,
                                               weight_decay=wd, momentum=float(cfg.get("momentum", 0.0) or 0.0)),
        # Keras' update rules (epsilon placement, decoupled weight decay): the keras-io examples' optimisers
        "keras_adam": lambda: KerasAdam(params, lr=lr, betas=betas, eps=keras_eps, weight_decay=wd),
        "keras_rmsprop": lambda: KerasRMSprop(params, lr=lr, rho=float(cfg.get("rho", 0.9)), eps=keras_eps,
                                              momentum=float(cfg.get("momentum", 0.0) or 0.0),
                                              centered=bool(cfg.get("centered", False)), weight_decay=wd),
    }
    makers["keras_adamw"] = makers["keras_adam"]  # Keras' AdamW is its Adam with a weight_decay
    if name not in makers:
        raise unknown_choice("optimizer", name, makers)
    return makers[name]()


def make_scheduler(opt, cfg, total_steps: int, steps_per_epoch: int):
    name, warm = cfg.name, int(cfg.get("warmup_steps", 0) or 0)
    warm = warm or int(cfg.get("warmup_epochs") or 0) * steps_per_epoch
    base_lr = opt.param_groups[0]["lr"]
    # Absolute start (warmup_lr) and floor (min_lr) of timm's CosineLRScheduler (DeiT: 1e-6, 1e-5);
    # left unset, the warm-up starts at lr / warmup_steps and the cosine decays to 0.
    start = float(cfg.get("warmup_lr")) / base_lr if cfg.get("warmup_lr") is not None else None
    floor = float(cfg.get("min_lr") or 0.0) / base_lr

    def warmup(step):
        if not warm:
            return 1.0
        if start is not None:  # timm: warmup_lr + step * (lr - warmup_lr) / warmup_t
            return start + (1.0 - start) * min(1.0, step / warm)
        return min(1.0, (step + 1) / warm)

    if name == "none":
        return None
    if name == "linear_warmup":
        return torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    if name == "cosine":
        def cosine(step):
            if step < warm:
                return warmup(step)
            progress = (step - warm) / max(1, total_steps - warm)
            return floor + (1.0 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    if name == "step":
        every = int(cfg.step_size) * steps_per_epoch
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup(s) * cfg.gamma ** (s // max(every, 1)))
    if name == "onecycle":  # torch OneCycleLR as the LRA PyTorch code (Nystromformer/Transformer-LS) uses it
        total = max(total_steps, 1)  # pct_start = warmup / total
        w = max(0, min(warm, total - 1))  # short runs: both phases need steps, and torch divides by w - 1
        if w == 1:
            w = 2 if total > 2 else 0
        return torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=total,
            pct_start=float(w) / total, anneal_strategy=str(cfg.get("anneal", "linear")),
            cycle_momentum=bool(cfg.get("cycle_momentum", True)))
    if name == "inverse_sqrt":  # fairseq's inverse_square_root_schedule (Vaswani et al. 2017, Sec. 5.3)
        # lr(n) after n updates: linear from warmup_init_lr to lr over the warm-up, then lr * sqrt(warm / n).
        def inverse_sqrt(step):
            if step < warm:
                start = float(cfg.get("warmup_init_lr") or 0.0) / float(opt.defaults["lr"])
                return start + step * (1.0 - start) / warm
            return math.sqrt(max(warm, 1) / max(step, 1))
        return torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt)
    raise unknown_choice("scheduler", name, SCHEDULERS)
