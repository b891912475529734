"""The Keras-based families (papers/002: text classification, translation, ViT) against Keras'
own rules, written out here: the Adam / AdamW / RMSprop update steps (keras/src/optimizers/
{adam,rmsprop}.py, base_optimizer.py ``_apply_weight_decay``) in float64 numpy, and the default
initialisers (glorot_uniform over each kernel's shape with ``compute_fans``, zero biases,
uniform(-0.05, 0.05) embeddings) on the kernel shapes of Dense and MultiHeadAttention."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

# Gradients from 10 down to 1e-9 (and an exact zero): below ~sqrt(epsilon) the epsilon placement
# decides the step size.
MAGNITUDES = np.array([10.0, -3.0, 0.5, -1e-2, 1e-4, -1e-6, 3e-8, -1e-9, 0.0])


def gradient_sequence(steps: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [MAGNITUDES * rng.uniform(0.5, 2.0, MAGNITUDES.shape) * rng.choice([-1, 1], MAGNITUDES.shape)
            for _ in range(steps)]


def keras_adam_reference(theta, grads, lr=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7, weight_decay=0.0):
    """keras Adam.update_step after base_optimizer._apply_weight_decay, step t = iterations + 1."""
    theta, m, v = theta.copy(), np.zeros_like(theta), np.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        theta = theta - theta * weight_decay * lr
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m = m + (g - m) * (1 - beta_1)
        v = v + (np.square(g) - v) * (1 - beta_2)
        theta = theta - (m * alpha) / (np.sqrt(v) + epsilon)
    return theta


def keras_rmsprop_reference(theta, grads, lr=1e-3, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False):
    """keras RMSprop.update_step."""
    theta = theta.copy()
    velocity, average_grad, mom = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    for g in grads:
        velocity = rho * velocity + (1 - rho) * np.square(g)
        if centered:
            average_grad = rho * average_grad + (1 - rho) * g
            denominator = velocity - np.square(average_grad) + epsilon
        else:
            denominator = velocity + epsilon
        increment = lr * g / np.sqrt(denominator)
        if momentum > 0:
            mom = momentum * mom + increment
            theta = theta - mom
        else:
            theta = theta - increment
    return theta


def run_optimizer(optimizer_cfg: dict, theta0: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    from bench_cli.engine.optim import make_optimizer

    p = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
    opt = make_optimizer([p], OmegaConf.create(optimizer_cfg))
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return p.detach().numpy()


THETA0 = np.linspace(-1.0, 1.0, MAGNITUDES.size)


@pytest.mark.parametrize("options", [{}, {"lr": 0.01, "weight_decay": 0.05, "betas": [0.8, 0.99], "eps": 1e-5}])
@pytest.mark.parametrize("name", ["keras_adam", "keras_adamw"])
def test_keras_adam_is_keras_update_rule(name, options):
    grads = gradient_sequence()
    got = run_optimizer({"name": name, "lr": 1e-3, **options}, THETA0, grads)
    beta_1, beta_2 = options.get("betas", (0.9, 0.999))
    want = keras_adam_reference(THETA0, grads, lr=options.get("lr", 1e-3), beta_1=beta_1, beta_2=beta_2,
                                epsilon=options.get("eps", 1e-7), weight_decay=options.get("weight_decay", 0.0))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("options", [{}, {"momentum": 0.5}, {"centered": True}, {"rho": 0.8, "eps": 1e-4, "lr": 0.05}])
def test_keras_rmsprop_is_keras_update_rule(options):
    grads = gradient_sequence()
    got = run_optimizer({"name": "keras_rmsprop", "lr": 1e-3, **options}, THETA0, grads)
    want = keras_rmsprop_reference(THETA0, grads, lr=options.get("lr", 1e-3), rho=options.get("rho", 0.9),
                                   momentum=options.get("momentum", 0.0), epsilon=options.get("eps", 1e-7),
                                   centered=options.get("centered", False))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_torch_rules_differ_where_the_gradient_is_tiny():
    """torch's Adam / RMSprop (kept as adam / rmsprop) move the tiny-gradient entries differently:
    the reason for the keras_* optimisers."""
    grads = gradient_sequence()
    large, tiny = np.abs(MAGNITUDES) >= 0.5, (np.abs(MAGNITUDES) <= 1e-6) & (MAGNITUDES != 0)
    for torch_name, keras_name in (("rmsprop", "keras_rmsprop"), ("adam", "keras_adam")):
        cfg = {"lr": 1e-3, "eps": 1e-7}
        torch_step = run_optimizer({"name": torch_name, **cfg}, THETA0, grads) - THETA0
        keras_step = run_optimizer({"name": keras_name, **cfg}, THETA0, grads) - THETA0
        np.testing.assert_allclose(torch_step[large], keras_step[large], rtol=1e-3)
        assert np.all(np.abs(torch_step[tiny]) > 1.5 * np.abs(keras_step[tiny])), torch_name


def test_keras_defaults_and_the_reproduction_configs_use_them():
    from bench_cli.config.compose import compose
    from bench_cli.engine.optim import KerasAdam, KerasRMSprop, make_optimizer

    p = [torch.nn.Parameter(torch.zeros(2))]
    rms = make_optimizer(p, OmegaConf.create({"name": "keras_rmsprop", "lr": 1e-3}))
    assert isinstance(rms, KerasRMSprop)
    assert {k: rms.defaults[k] for k in ("lr", "rho", "momentum", "eps", "centered", "weight_decay")} == \
        {"lr": 1e-3, "rho": 0.9, "momentum": 0.0, "eps": 1e-7, "centered": False, "weight_decay": 0.0}
    adam = make_optimizer(p, OmegaConf.create({"name": "keras_adam", "lr": 1e-3}))
    assert isinstance(adam, KerasAdam) and adam.defaults["betas"] == (0.9, 0.999) and adam.defaults["eps"] == 1e-7
    expected = {("task=textcls",): ("keras_adam", 0.0), ("task=nmt",): ("keras_rmsprop", 0.0),
                ("experiment=pay_better_attention/table5_mnist5k_cpu",): ("keras_adamw", 1e-4)}
    for overrides, (name, weight_decay) in expected.items():
        opt = compose(list(overrides)).trainer.optimizer
        assert (opt.name, float(opt.lr), float(opt.eps), float(opt.weight_decay)) == (name, 1e-3, 1e-7, weight_decay)
        assert tuple(opt.get("betas", (0.9, 0.999))) == (0.9, 0.999) and float(opt.get("rho", 0.9)) == 0.9


# --- initialisation -------------------------------------------------------------------------------
def keras_compute_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """keras compute_fans (no input/output axes): rank > 2 kernels count as convolution kernels."""
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive_field = math.prod(shape[:-2])
    return shape[-2] * receptive_field, shape[-1] * receptive_field


def glorot_limit(shape: tuple[int, ...]) -> float:
    fan_in, fan_out = keras_compute_fans(shape)
    return math.sqrt(6.0 / (fan_in + fan_out))


def mha_kernel_shapes(d: int, h: int) -> dict[str, tuple[int, ...]]:
    """Keras MultiHeadAttention(num_heads=h, key_dim=d // h) on width d: its EinsumDense kernels."""
    return {"q_proj": (d, h, d // h), "k_proj": (d, h, d // h), "v_proj": (d, h, d // h), "out_proj": (h, d // h, d)}


def collect_draws(net: torch.nn.Module, init, draws: int) -> dict[str, np.ndarray]:
    """Every parameter of ``net`` over ``draws`` initialisations, flattened per name."""
    values: dict[str, list[np.ndarray]] = {}
    for _ in range(draws):
        init(net)
        for name, p in net.named_parameters():
            values.setdefault(name, []).append(p.detach().double().flatten().numpy())
    return {name: np.concatenate(v) for name, v in values.items()}


def assert_uniform(values: np.ndarray, limit: float, name: str) -> None:
    """uniform(-limit, limit): inside the bound, reaching it, std limit / sqrt(3) (within 5 standard
    errors: a uniform sample's std has a relative standard error of sqrt(0.2 / n))."""
    assert values.size >= 500, name
    assert np.abs(values).max() <= limit * (1 + 1e-6), (name, np.abs(values).max(), limit)
    assert np.abs(values).max() >= 0.98 * limit, (name, np.abs(values).max(), limit)
    tolerance = 5 * math.sqrt(0.2 / values.size)
    assert abs(values.std() / (limit / math.sqrt(3)) - 1) < tolerance, (name, values.std(), limit / math.sqrt(3))


def expected_keras_limits(net: torch.nn.Module) -> dict[str, float | None]:
    """Parameter name -> Keras' uniform limit (None: zeros; LayerNorm weights skipped)."""
    from attnbench.models.attention.base import AttentionBase

    limits: dict[str, float | None] = {}
    for module_name, module in net.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, AttentionBase):
            for proj, shape in mha_kernel_shapes(module.d_model, module.n_heads).items():
                if hasattr(module, proj):
                    limits[f"{prefix}{proj}.weight"] = glorot_limit(shape)
        elif isinstance(module, torch.nn.Linear):
            limits.setdefault(f"{prefix}weight", glorot_limit((module.in_features, module.out_features)))
        elif isinstance(module, torch.nn.Embedding):
            limits[f"{prefix}weight"] = 0.05
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module.bias is not None:
            limits[f"{prefix}bias"] = None
    return limits


def assert_keras_limits(net: torch.nn.Module, values: dict[str, np.ndarray]) -> set[str]:
    """Every parameter with a Keras rule follows it over the draws; returns their names."""
    limits = expected_keras_limits(net)
    for name, limit in limits.items():
        if limit is None:
            assert not values[name].any(), name
        else:
            assert_uniform(values[name], limit, name)
    return set(limits)


def check_keras_init(net: torch.nn.Module, draws: int) -> set[str]:
    from attnbench.models.init import keras_init_

    return assert_keras_limits(net, collect_draws(net, keras_init_, draws))


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("variant", ["standard", "optimised", "efficient", "super"])
def test_text_classifier_is_initialised_as_keras(variant, heads, single_thread):
    from attnbench.models.text import build_text_classifier

    model_cfg = OmegaConf.create({"attention": {"name": variant, "dropout": 0.0}})
    backbone = {"n_layers": 1, "d_model": 32, "n_heads": heads, "d_ff": 32, "init": "keras"}
    net = build_text_classifier(model_cfg, backbone, vocab_size=40, max_len=16, n_classes=2)
    checked = check_keras_init(net, draws=30)
    attention = net.layers[0].attention
    assert "layers.0.attention.q_proj.weight" in checked and "embedding.token.weight" in checked
    if variant == "super":  # W^A: a Dense-shaped (l, l) kernel with a zero bias
        assert "layers.0.attention.align.weight" in checked
    # the MultiHeadAttention kernels are not the per-(d, d) Glorot's (2.4x at h 4, 4.1x at h 1 here)
    assert attention.q_proj.weight.abs().max() < 0.45 * math.sqrt(6.0 / 64)


@pytest.mark.parametrize("heads", [1, 4])
def test_translation_model_self_and_cross_attention_are_keras_kernels(heads, single_thread):
    from attnbench.models.text import build_translation_model

    model_cfg = OmegaConf.create({"attention": {"name": "optimised", "dropout": 0.0}})
    backbone = {"d_model": 16, "n_heads": heads, "d_ff": 32, "init": "keras"}
    net = build_translation_model(model_cfg, backbone, src_vocab=30, tgt_vocab=25, src_len=6, tgt_len=7,
                                  stacks={"encoder": 1, "decoder": 1, "cross": 1})
    checked = check_keras_init(net, draws=60)
    assert {"decoder.0.cross_attention.q_proj.weight", "decoder.0.cross_attention.out_proj.weight",
            "output.weight", "tgt_embedding.position.weight"} <= checked


@pytest.mark.parametrize("heads", [1, 4])
def test_vit_is_initialised_as_the_keras_example(heads, single_thread):
    """The ViT's attention, MLP and head as Keras; the patch projection is keras' Dense over
    flattened p x p x C patches; the position Embedding uniform(+-0.05)."""
    from attnbench.models.vision import build_vision_transformer

    model_cfg = OmegaConf.create({"attention": {"name": "super", "dropout": 0.0}})
    backbone = {"image_size": 8, "patch_size": 4, "d_model": 16, "n_layers": 1, "n_heads": heads, "d_ff": 32,
                "cls_token": False, "pooling": "mean", "head_hidden": [8], "init": "keras"}
    net = build_vision_transformer(model_cfg, backbone, in_channels=3, n_classes=5)
    values = collect_draws(net, lambda m: m.reset_parameters("keras"), draws=60)
    checked = assert_keras_limits(net, values)
    assert_uniform(values["patch_embed.proj.weight"], glorot_limit((4 * 4 * 3, 16)), "patch projection")
    assert_uniform(values["pos_embed"], 0.05, "position embedding")
    assert "blocks.0.attention.q_proj.weight" in checked and "blocks.0.attention.align.weight" in checked
