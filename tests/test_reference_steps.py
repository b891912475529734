"""One update of each family's reproduction config, as the project trains it, against the update
the reference code computes, written out here by hand in float64 (the reproduction must train as the
reference code does, not only compose the same numbers).

The project side is the trainer's own path: the composed experiment, ``Trainer.optimisation``
(bench_cli.engine.optim: parameter groups, optimiser, schedule), the step loop (``_Loop.epoch``:
micro-batch accumulation, clipping, the scheduler) and the run's ``Objective`` (task loss + eta x
KSVD). The reference side takes the same initial weights, the same batches and the same dropout
draws (the random state before each forward), and computes the loss, the gradient normalisation,
the clipping, the learning rate and the optimiser update the way the reference code does:

- text classification (keras-io text_classification_with_transformer): Keras Adam, mean sparse
  cross-entropy over the batch;
- translation (keras-io neural_machine_translation_with_transformer): Keras RMSprop (epsilon inside
  the square root), sparse cross-entropy over the positions the decoder inputs' mask keeps,
  divided by their number (Keras' ``apply_mask``: total / valid weights);
- ViT (keras-io image_classification_with_vision_transformer): Keras AdamW, decoupled weight decay
  on every weight, mean sparse cross-entropy from logits;
- language model (fairseq, PrimalAttention_NLP): Adam with decoupled weight decay as fairseq runs
  it on a GPU (apex FusedAdam, adam_w_mode), the SUMMED token NLL of each --max-tokens batch plus
  0.1 x J, the update's gradient divided by its token count, inverse-sqrt warm-up from 1e-7;
- Decision Transformer (PrimalAttention_RL seq_trainer.py): torch AdamW, LambdaLR
  min((t + 1) / warmup, 1), gradient norm clipped at 0.25, mean squared action error over the
  unpadded steps plus 0.05 x J.

Each case compares the change of every parameter over two updates (not the weights: a warm-up
step of 1e-7 would hide in them), and each has a mutation of the config that must make it fail.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

from bench_cli.config.compose import compose
from bench_cli.engine.objective import Objective
from bench_cli.config.taskfit import build_task
from bench_cli.engine.env import seed_everything
from bench_cli.engine.trainer import Trainer, TrainResult, _Loop
from attnbench.models.attention import collect_auxiliary_loss
from test_lm import write_wikitext
from test_text import imdb_rows, write_imdb, write_spa

pytestmark = pytest.mark.usefixtures("float64_single_thread")

STEPS = 2


# --- the project's update --------------------------------------------------------------------------
@dataclass
class Update:
    initial: torch.nn.Module  # the weights before the first update (a copy)
    model: torch.nn.Module  # after STEPS updates
    forwards: list  # (random state before the forward, float64 batch) of every forward, in order
    accum: int  # forwards per update
    cfg: object
    task: object


def float64(batch: dict) -> dict:
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}


def project_update(overrides: list[str], data_root) -> Update:
    """STEPS updates of the composed config through the trainer's step loop."""
    cfg = compose([*overrides, f"trainer.max_steps={STEPS}",
                   "trainer.eval_every_steps=null", "trainer.progress=false", "seed=0"])
    task = build_task(cfg)
    task.setup(str(cfg.task.protocol))
    seed_everything(0)
    model = task.build_model(cfg.model)
    initial = copy.deepcopy(model)
    trainer = Trainer(cfg.trainer, task, model, torch.device("cpu"), 0, objective=Objective.of(task, cfg.model))
    forwards, forward_loss = [], trainer.forward_loss

    def recorded(batch):  # float64 inputs (the loaders give float32 features), each forward recorded
        batch = float64(batch)
        forwards.append((torch.get_rng_state(), batch))
        return forward_loss(batch)

    trainer.forward_loss = recorded
    loader = trainer.loader("train", train=True)
    plan = trainer.schedule(loader)
    assert plan.total_steps == STEPS
    opt, sched, scaler = trainer.optimisation(plan)
    loop = _Loop(trainer, plan, opt, sched, scaler, TrainResult(task.selection_metric(), None, plan), selection=None,
                 train_loader=loader)
    model.train()
    epoch = 0
    while loop.step < STEPS:  # the loop's epochs without their evaluations
        epoch += 1
        loop.epoch(loader, epoch)
    assert len(forwards) == STEPS * plan.accum
    return Update(initial, model, forwards, plan.accum, cfg, task)


# --- the references' pieces ------------------------------------------------------------------------
def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[target] per position, written out."""
    return torch.logsumexp(logits, -1) - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def clip_by_total_norm(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """torch.nn.utils.clip_grad_norm_ as the DT code calls it: scale by max_norm / (norm + 1e-6) when below 1."""
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    scale = max_norm / (norm + 1e-6)
    return [g * scale for g in grads] if scale < 1 else grads


def keras_adam(p, g, state, lr, wd=0.0, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """keras Adam / AdamW (base_optimizer._apply_weight_decay, then adam.update_step)."""
    t = state["t"] = state.get("t", 0) + 1
    m0, v0 = state.get("m", torch.zeros_like(p)), state.get("v", torch.zeros_like(p))
    m = state["m"] = m0 + (g - m0) * (1 - beta_1)
    v = state["v"] = v0 + (g * g - v0) * (1 - beta_2)
    p = p - p * wd * lr
    alpha = lr * math.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    return p - m * alpha / (v.sqrt() + epsilon)


def keras_rmsprop(p, g, state, lr, rho=0.9, epsilon=1e-7):
    """keras RMSprop.update_step (no momentum, not centred): lr g / sqrt(v + epsilon)."""
    v = state["v"] = rho * state.get("v", torch.zeros_like(p)) + (1 - rho) * g * g
    return p - lr * g / (v + epsilon).sqrt()


def adamw(p, g, state, lr, wd, beta_1, beta_2, epsilon):
    """Decoupled weight decay Adam (Loshchilov & Hutter): torch.optim.AdamW, and apex's FusedAdam
    in adam_w_mode, p - lr (m_hat / (sqrt(v_hat) + eps) + wd p)."""
    t = state["t"] = state.get("t", 0) + 1
    m = state["m"] = beta_1 * state.get("m", torch.zeros_like(p)) + (1 - beta_1) * g
    v = state["v"] = beta_2 * state.get("v", torch.zeros_like(p)) + (1 - beta_2) * g * g
    m_hat, v_hat = m / (1 - beta_1**t), v / (1 - beta_2**t)
    return p - lr * (m_hat / (v_hat.sqrt() + epsilon) + wd * p)


def reference_update(u: Update, update_loss, normalise, rule, lr_at, clip=None, inputs=None) -> torch.nn.Module:
    """STEPS updates of a copy of ``u.initial`` on ``u.forwards``: each update's gradient is that of
    the sum of ``update_loss(model, output, batch)`` over its forwards, ``normalise``d over the
    update's batches, clipped, and applied by ``rule(p, g, state, lr)`` with ``lr_at(step)``.
    ``inputs(batch)``: the model's inputs as the reference builds them (default: the task's)."""
    inputs = inputs or u.task.model_inputs
    model = copy.deepcopy(u.initial)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    states = [{} for _ in params]
    for step in range(STEPS):
        forwards = u.forwards[step * u.accum:(step + 1) * u.accum]
        total = 0
        for rng, batch in forwards:
            torch.set_rng_state(rng)  # the project's dropout draws
            total = total + update_loss(model, model(**inputs(batch)), batch)
        grads = torch.autograd.grad(total, params, allow_unused=True)
        scale = normalise([b for _, b in forwards])
        grads = [torch.zeros_like(p) if g is None else g / scale for p, g in zip(params, grads)]
        if clip:
            grads = clip_by_total_norm(grads, clip)
        with torch.no_grad():
            for p, g, state in zip(params, grads, states):
                p.copy_(rule(p, g, state, lr_at(step)))
    return model


def assert_same_update(u: Update, reference: torch.nn.Module, rtol: float = 1e-9) -> None:
    """Every parameter moved by the same amount in the project and the reference, to ``rtol`` of
    its own largest move or of the model's (a parameter whose gradient is round-off, such as a key
    bias under softmax, moves by round-off), plus the float64 spacing of its values (a move is read
    as the difference of two weights)."""
    before = dict(u.initial.named_parameters())
    ref = dict(reference.named_parameters())
    moves = {name: (p.detach() - before[name].detach(), ref[name].detach() - before[name].detach())
             for name, p in u.model.named_parameters()}
    largest = max(float(want.abs().max()) for _, want in moves.values())
    assert largest > 0
    for name, (got, want) in moves.items():
        error, scale = float((got - want).abs().max()), float(want.abs().max())
        spacing = 8 * torch.finfo(torch.float64).eps * float(before[name].detach().abs().max())
        assert error <= rtol * max(scale, 1e-3 * largest) + spacing, (name, error, scale, largest)


def mean_over(batches) -> float:
    return float(len(batches))


def fails(check) -> bool:
    try:
        check()
    except AssertionError:
        return True
    return False


# --- the cases ---------------------------------------------------------------------------------------
TEXT_TINY = ["task.backbone.n_layers=1", "trainer.batch_size=6"]


def textcls_case(data, mutation=()):
    write_imdb(data, imdb_rows(24, 0), imdb_rows(12, 1))
    u = project_update(["experiment=pay_better_attention/table2", "task.dataset=imdb", "model=standard",
                        *TEXT_TINY, *mutation], data)
    lr = float(u.cfg.trainer.optimizer.lr)
    ref = reference_update(u, lambda m, out, b: token_nll(out, b["y"]).mean(), mean_over,
                           lambda p, g, s, lr: keras_adam(p, g, s, lr), lambda step: lr)
    assert_same_update(u, ref)


NMT_TINY = ["task.dataset=anki", "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2",
            "task.val_fraction=0.1", "task.test_fraction=0.1", "trainer.batch_size=8"]


def keras_sequences(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's decoder input and target: the Spanish ids [start] ... [end] padded with 0
    (TextVectorization to 21), without their last / first id."""
    spanish = torch.cat([batch["tgt_in"][:, :1], batch["tgt_out"]], 1)
    return spanish[:, :-1], spanish[:, 1:]


def keras_inputs(batch) -> dict:
    decoder_input, _ = keras_sequences(batch)
    return {"src": batch["src"], "tgt": decoder_input, "src_mask": batch["src"] != 0, "tgt_mask": decoder_input != 0}


def keras_masked_nll(model, out, batch):
    """Keras' masked loss: the mask of the decoder inputs (Embedding mask_zero) as the weights, the
    sum over the valid positions divided by their number (losses/loss.py apply_mask)."""
    decoder_input, target = keras_sequences(batch)
    mask = (decoder_input != 0).to(out.dtype)
    return (token_nll(out, target) * mask).sum() / mask.sum()


def nmt_case(data, mutation=()):
    write_spa(data, 40)
    u = project_update(["experiment=pay_better_attention/table3", "model=standard", *NMT_TINY, *mutation], data)
    lr = float(u.cfg.trainer.optimizer.lr)
    ref = reference_update(u, keras_masked_nll, mean_over, lambda p, g, s, lr: keras_rmsprop(p, g, s, lr),
                           lambda step: lr, inputs=keras_inputs)
    assert_same_update(u, ref)


VIT_TINY = ["task.sizes.mnist5k.n_layers=1", "trainer.batch_size=8"]


def vit_case(data, mutation=()):
    u = project_update(["experiment=pay_better_attention/table5_mnist5k_cpu", "model=standard", *VIT_TINY,
                        *mutation], data)
    opt = u.cfg.trainer.optimizer
    lr, wd = float(opt.lr), float(opt.weight_decay)
    ref = reference_update(u, lambda m, out, b: token_nll(out, b["y"]).mean(), mean_over,
                           lambda p, g, s, lr: keras_adam(p, g, s, lr, wd=wd), lambda step: lr)
    assert_same_update(u, ref)


SENTENCE_15 = " The game is a role @-@ playing game made in Japan by Sega in 2008 \n"  # 15 tokens + </s>


def lm_case(data, model, mutation=(), eta=4.8828125e-05):
    """wikitext103's experiment on a corpus of 16 x 512 tokens (every block full, as all but the
    last of WikiText-103); micro-batches of 4 x 512 = fairseq's --max-tokens 2048, two per update."""
    write_wikitext(data / "wikitext" / "fixture", {"train": SENTENCE_15 * 512, "valid": SENTENCE_15 * 40,
                                                   "test": SENTENCE_15 * 40})
    per_dataset = [f"+per_dataset.{k}.primal_plus.fixture={v}" for k, v in
                   (("low_rank", 30), ("data_dependent", "false"), ("eta", eta))]
    u = project_update(["experiment=primal_attention/wikitext103", "task.dataset=fixture", f"model={model}",
                        *per_dataset, "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_layers=2",
                        "task.backbone.n_heads=2", "trainer.batch_size=8", *mutation], data)
    assert u.accum == 2 and all(int((b["y"] != -100).sum()) == 2048 for _, b in u.forwards)
    opt, sched = u.cfg.trainer.optimizer, u.cfg.trainer.scheduler
    lr, wd, warm, init_lr = float(opt.lr), float(opt.weight_decay), int(sched.warmup_steps), float(sched.warmup_init_lr)

    def fairseq_loss(m, out, batch):  # criterions/cross_entropy.py of the fork: summed NLL + 0.1 x J
        y = batch["y"]
        nll = token_nll(out[y != -100], y[y != -100]).sum()
        ksvd = collect_auxiliary_loss(m, "mean")
        return nll + (0.1 * ksvd if ksvd is not None else 0)

    def fairseq_lr(step):  # inverse_square_root_schedule: lr after `step` updates
        return init_lr + step * (lr - init_lr) / warm if step < warm else lr * math.sqrt(warm / step)

    ref = reference_update(u, fairseq_loss, lambda batches: float(sum(int((b["y"] != -100).sum()) for b in batches)),
                           lambda p, g, s, lr: adamw(p, g, s, lr, wd, 0.9, 0.98, 1e-8), fairseq_lr)
    assert_same_update(u, ref)


def write_d4rl(data):
    """hopper-medium-v2 in D4RL's layout: 6 trajectories of 30 steps (the last padded windows)."""
    import numpy as np
    from test_d4rl import write_hdf5

    rng = np.random.default_rng(0)
    n = 180
    terminals = np.zeros(n, bool)
    terminals[29::30] = True
    write_hdf5(data / "d4rl" / "hopper-medium-v2.hdf5", observations=rng.normal(size=(n, 11)).astype(np.float32),
               actions=rng.uniform(-1, 1, (n, 3)).astype(np.float32), rewards=rng.uniform(0, 3, n).astype(np.float32),
               terminals=terminals, timeouts=np.zeros(n, bool))


def d4rl_case(data, model, mutation=()):
    write_d4rl(data)
    u = project_update(["experiment=primal_attention/d4rl", "task.dataset=hopper-medium-v2", f"model={model}",
                        "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2",
                        "trainer.batch_size=8", *mutation], data)
    assert any(not bool(b["mask"].all()) for _, b in u.forwards)  # padded steps are in the batches
    opt, sched = u.cfg.trainer.optimizer, u.cfg.trainer.scheduler
    lr, wd, warm = float(opt.lr), float(opt.weight_decay), int(sched.warmup_steps)
    eta = float(u.cfg.model.get("eta") or 0.0)

    def dt_loss(m, action_preds, batch):  # seq_trainer.py: MSE over attention_mask > 0, + eta x J
        mask = batch["mask"]
        loss = ((action_preds[mask] - batch["actions"][mask]) ** 2).mean()
        ksvd = collect_auxiliary_loss(m, "mean")
        return loss + (eta * ksvd if ksvd is not None else 0)

    ref = reference_update(u, dt_loss, lambda batches: 1.0, lambda p, g, s, lr: adamw(p, g, s, lr, wd, 0.9, 0.999, 1e-8),
                           lambda step: lr * min((step + 1) / warm, 1.0), clip=0.25)
    assert_same_update(u, ref)


# --- the tests: each case as configured, and failing under a mutation ----------------------------------
def test_textcls_update_is_keras_adam(workdir):
    textcls_case(workdir / "data")
    assert fails(lambda: textcls_case(workdir / "data", ["trainer.optimizer.name=adam"]))  # torch's epsilon


def test_nmt_update_is_keras_rmsprop_over_the_masked_positions(workdir):
    nmt_case(workdir / "data")
    assert fails(lambda: nmt_case(workdir / "data", ["trainer.optimizer.name=rmsprop"]))  # sqrt(v) + eps
    assert fails(lambda: nmt_case(workdir / "data", ["task.loss_positions=targets"]))  # not keras' mask


def test_vit_update_is_keras_adamw(workdir):
    vit_case(workdir / "data")
    assert fails(lambda: vit_case(workdir / "data", ["trainer.optimizer.name=adamw"]))  # torch's AdamW


@pytest.mark.parametrize("model", ["softmax", "primal_plus"])
def test_lm_update_is_fairseqs(workdir, model):
    lm_case(workdir / "data", model)
    if model == "primal_plus":  # 0.1 x J per 2048-token batch on the summed NLL is eta 0.1 / 2048
        assert fails(lambda: lm_case(workdir / "data", model, eta=0.1))
    else:
        assert fails(lambda: lm_case(workdir / "data", model, ["trainer.optimizer.name=adam"]))  # coupled decay


@pytest.mark.parametrize("model", ["softmax", "primal_plus"])
def test_d4rl_update_is_the_decision_transformers(workdir, model):
    d4rl_case(workdir / "data", model)
    assert fails(lambda: d4rl_case(workdir / "data", model, ["trainer.grad_clip=null"]))
