"""D4RL with a Decision Transformer (task=d4rl): trajectory split, returns-to-go, padding and
standardisation on a hand-made HDF5 in D4RL's layout, the normalised score, the rollout loop
against gymnasium stepped by hand, causality of every causal variant in the DT, the fetcher, and
an end-to-end run on a dataset recorded from a real MuJoCo environment."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from bench_cli.commands.cli import main
from bench_cli.config.compose import compose
from bench_cli.results.csv_store import read_records
from conftest import causal_config, causal_models
from attnbench.tasks import task_class
from attnbench.tasks.fetch import fetcher
from attnbench.tasks.d4rl.data import TrajectoryWindows, d4rl_filename, normalized_score, read_hdf5, trajectory_bounds

pytestmark = pytest.mark.usefixtures("single_thread")


def write_hdf5(path, **arrays):
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v
    return path


def hand_made(path):
    """Trajectories of 3 (terminal), 25 (timeout) and 2 (terminal) steps, then 2 steps without an
    end (dropped). State dim 2, action dim 1; rewards = global step index."""
    n = 32
    obs = np.stack([np.arange(n), 10.0 * np.arange(n) ** 2], 1).astype(np.float32)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    terminals[[2, 29]] = True
    timeouts[27] = True
    return write_hdf5(path, observations=obs, actions=(np.arange(n, dtype=np.float32) / 100)[:, None],
                      rewards=np.arange(n, dtype=np.float32), terminals=terminals, timeouts=timeouts)


def test_trajectories_rtg_padding_and_standardisation(tmp_path):
    data = read_hdf5(hand_made(tmp_path / "toy.hdf5"))
    assert trajectory_bounds(data["terminals"], data["timeouts"]) == [(0, 3), (3, 28), (28, 30)]
    w = TrajectoryWindows(data, context_len=20, max_ep_len=1000, reward_scale=1000.0)
    assert len(w) == 30 and w.info["trajectories"] == 3  # one sample per kept step
    kept = data["observations"][:30]
    assert np.allclose(w.state_mean, kept.mean(0)) and np.allclose(w.state_std, kept.std(0) + 1e-6)
    standard = lambda s: (s - kept.mean(0)) / (kept.std(0) + 1e-6)  # noqa: E731

    s = w[3 + 23]  # trajectory 2 from its step 23: 2 real steps (global 26, 27), 18 padded
    assert s["mask"].tolist() == [True] * 2 + [False] * 18
    assert np.allclose(s["states"][:2], standard(data["observations"][26:28]), atol=1e-5)
    assert np.allclose(s["states"][2:], standard(np.zeros(2)), atol=1e-5)  # zero-padded, then standardised
    assert s["actions"][:2, 0].tolist() == pytest.approx([0.26, 0.27]) and (s["actions"][2:] == -10).all()
    # returns-to-go: K + 1 values, sums of the rewards to the trajectory's end, 0 past it, / 1000
    assert s["rtg"][:, 0].tolist() == pytest.approx([(26 + 27) / 1000, 27 / 1000] + [0.0] * 19)
    assert s["timesteps"].tolist() == [23, 24] + [0] * 18

    s = w[3]  # trajectory 2 from its start: a full window, the (K+1)-th return-to-go is the next step's
    assert s["mask"].all() and s["timesteps"].tolist() == list(range(20))
    assert s["rtg"][0, 0].item() == pytest.approx(sum(range(3, 28)) / 1000)
    assert s["rtg"][20, 0].item() == pytest.approx(sum(range(23, 28)) / 1000)

    s = w[1]  # trajectory 1, from step 1: rewards 1, 2
    assert s["rtg"][:3, 0].tolist() == pytest.approx([3 / 1000, 2 / 1000, 0.0]) and s["mask"].sum() == 2

    clipped = TrajectoryWindows(data, context_len=20, max_ep_len=10)
    assert clipped[3]["timesteps"].tolist() == list(range(10)) + [9] * 10  # clipped at max_ep_len - 1


def test_normalised_score_uses_d4rl_reference_returns():
    assert normalized_score("hopper", [-20.272305, 3234.3]).tolist() == pytest.approx([0.0, 100.0])
    assert normalized_score("halfcheetah", [(12135.0 - 280.178953) / 2]).item() == pytest.approx(50.0)
    assert normalized_score("walker2d", [4592.3]).item() == pytest.approx(100.0)
    assert d4rl_filename("halfcheetah-medium-replay-v2") == "halfcheetah_medium_replay-v2.hdf5"


def test_both_target_returns_are_reported_the_first_as_default(monkeypatch):
    """experiment.py evaluates every env_targets entry and logs (return_mean - ref_min) / (ref_max -
    ref_min) for each (trainer.py); the paper does not say which it printed: the task records both,
    the first as normalized_return (the default, the selection), the second by position."""
    from types import SimpleNamespace

    from bench_cli.core.task import EvalContext
    from attnbench.tasks.d4rl import rollout

    returns_by_target = {12000.0: np.array([9000.0, 11000.0]), 6000.0: np.array([5000.0, 5200.0])}
    monkeypatch.setattr(rollout, "rollouts", lambda model, env, seeds, target, **kw: (
        returns_by_target[target], np.array([1000, 1000])))
    task = task_class("d4rl")(compose(["task=d4rl", "task.dataset=halfcheetah-medium-v2",
                                       "task.eval.test_episodes=2"]).task, "/nonexistent")
    task.windows = SimpleNamespace(state_mean=np.zeros(17), state_std=np.ones(17))
    out = task.evaluate(None, "test", EvalContext(loader=None, device=torch.device("cpu")))
    ref_min, ref_max = -280.178953, 12135.0  # d4rl.infos REF_MIN_SCORE / REF_MAX_SCORE, halfcheetah
    first, second = ((np.mean(r) - ref_min) / (ref_max - ref_min) * 100 for r in returns_by_target.values())
    assert out["normalized_return"] == pytest.approx(first) == out["normalized_return_12000"]
    assert out["normalized_return_target2"] == pytest.approx(second) == out["normalized_return_6000"]
    assert "normalized_return_target1" not in out  # the first is normalized_return itself
    for exp in ("primal_attention/d4rl", "primal_attention/d4rl_s"):  # the reports show both, first as headline
        report = compose([f"experiment={exp}"]).report
        columns = [c.column for c in report.columns]
        assert columns[:2] == ["test_normalized_return", "test_normalized_return_target2"], exp
        assert {c.paper_metric for c in report.columns[:2]} == {"reward"} and "targets" in report.notes


def test_loss_ignores_padded_steps(tmp_path):
    hand_made(tmp_path / "d4rl" / "hopper-toy-v2.hdf5")
    task = task_class("d4rl")(compose(["task=d4rl", "task.dataset=hopper-toy-v2"]).task, tmp_path)
    task.setup("holdout")
    batch = {k: v[None] for k, v in task.splits["train"][3 + 23].items()}
    perfect = batch["actions"].clone()
    perfect[~batch["mask"]] = 123.0  # whatever is predicted at padded steps does not count
    assert task.loss(perfect, batch).item() == 0.0


class ZeroPolicy(torch.nn.Module):
    def forward(self, states, actions, returns_to_go, timesteps):
        self.seen = getattr(self, "seen", []) + [(states.shape[1], returns_to_go[0, -1, 0].item(), timesteps[0, -1].item())]
        return torch.zeros(states.shape[0], states.shape[1], 3)


def test_rollouts_match_gymnasium_stepped_by_hand():
    import gymnasium as gym

    from attnbench.tasks.d4rl.rollout import rollouts

    model = ZeroPolicy()
    returns, lengths = rollouts(model, "hopper", [7, 8], 3600.0, state_mean=np.zeros(11), state_std=np.ones(11),
                                context_len=4, max_episode_steps=25)
    for seed, ret, length in zip([7, 8], returns, lengths):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make("Hopper-v4", max_episode_steps=25)
        env.reset(seed=seed)
        total, steps, done = 0.0, 0, False
        while not done:
            _, r, term, trunc, _ = env.step(np.zeros(3, np.float32))
            total, steps, done = total + r, steps + 1, term or trunc
        env.close()
        assert ret == pytest.approx(total) and length == steps
    # the context grows to K = 4; the return-to-go starts at 3600 / 1000 and falls by reward / 1000
    assert [s[0] for s in model.seen[:6]] == [1, 2, 3, 4, 4, 4] and model.seen[0][1:] == pytest.approx((3.6, 0))
    assert model.seen[1][1] < 3.6 and model.seen[5][2] == 5


@pytest.mark.parametrize("model", causal_models(3))
def test_every_causal_variant_is_causal_in_the_decision_transformer(model, tmp_path):
    cfg = causal_config(("task=d4rl", "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2",
                         "task.context_len=6"), model, "hopper-medium-v2")
    task = task_class("d4rl")(cfg.task, tmp_path)
    task.setup_synthetic(18)
    torch.manual_seed(0)
    net = task.build_model(cfg.model).eval()
    batch = task.synthetic_batch(2, 18)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["actions"][:, 3:] = torch.rand(2, 3, 3)  # a_3.. come after the tokens R_3, s_3
    changed["states"][:, 4:] = torch.randn(2, 2, 11)
    changed["rtg"][:, 4:] = torch.rand(2, 3, 1)
    with torch.no_grad():
        a, b = net(**task.model_inputs(batch)), net(**task.model_inputs(changed))
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-5), "a later token changed an earlier action"
    assert not torch.allclose(a[:, 4:], b[:, 4:])


# PrimalAttention_RL's init rules, transcribed (decision_transformer.py, trajectory_gpt2.py,
# primal_attention.py; transformers 4.5.1, torch 1.8.1). GPT2Model.__init__ builds its blocks (the
# Primal block's Primal_attention included) and then calls init_weights(), i.e. _init_weights on each
# module: Linear / Conv1D / Embedding weight normal(0, initializer_range 0.02), Linear / Conv1D bias 0,
# LayerNorm weight 1 and bias 0. Primal_attention's own Parameters are no such module's: We, Wr keep
# nn.init.orthogonal_ of the whole (heads, d_keys, s) tensor, Lambda uniform_(0, 1). The DT builds
# embed_* / embed_ln / predict_* after the GPT2Model: torch defaults (Embedding normal(0, 1); Linear
# kaiming_uniform(a=sqrt 5) weight and bias both uniform(+-1/sqrt(fan_in)); LayerNorm 1 / 0).
GPT2_INITIALIZER_RANGE = 0.02
PRIMAL_OWN_PARAMETERS = {"we": "orthogonal_whole", "wr": "orthogonal_whole", "lam": "uniform_0_1"}  # ours: theirs We, Wr, Lambda


def reference_init_rule(owner: torch.nn.Module, attribute: str, inside_gpt2: bool) -> tuple:
    """What the reference code draws for the parameter ``attribute`` of module ``owner``."""
    if attribute in PRIMAL_OWN_PARAMETERS:
        return (PRIMAL_OWN_PARAMETERS[attribute],)
    if isinstance(owner, torch.nn.LayerNorm):
        return ("constant", 1.0 if attribute == "weight" else 0.0)
    if inside_gpt2:
        return ("normal", GPT2_INITIALIZER_RANGE) if attribute == "weight" else ("constant", 0.0)
    if isinstance(owner, torch.nn.Embedding):
        return ("normal", 1.0)
    if isinstance(owner, torch.nn.Linear):
        return ("uniform", 1 / owner.in_features ** 0.5)
    raise AssertionError(f"no reference rule for {type(owner).__name__}.{attribute}")


def assert_drawn_by(p: torch.Tensor, rule: tuple, name: str) -> None:
    kind, n = rule[0], p.numel()
    if kind == "constant":
        assert torch.equal(p, torch.full_like(p, rule[1])), name
    elif kind == "normal":  # sample std within 6%; tails beyond a uniform's of that std
        assert abs(p.std().item() / rule[1] - 1) < 0.06 and abs(p.mean().item()) < 5 * rule[1] / n ** 0.5, name
        assert p.abs().max().item() > 2.5 * rule[1], name
    elif kind == "uniform":
        assert p.abs().max().item() <= rule[1], name
        if n >= 200:
            assert abs(p.std().item() / (rule[1] / 3 ** 0.5) - 1) < 0.15, name
    elif kind == "uniform_0_1":
        assert p.min().item() >= 0 and p.max().item() < 1 and abs(p.std().item() * 12 ** 0.5 - 1) < 0.15, name
    elif kind == "orthogonal_whole":  # orthogonal_ flattens (heads, rows, s) to (heads, rows * s)
        flat = p.detach().reshape(p.shape[0], -1)
        assert torch.allclose(flat @ flat.T, torch.eye(p.shape[0]), atol=1e-5), name


@pytest.mark.parametrize("model", ["softmax", "flowformer", "primal_plus"])
def test_decision_transformer_init_is_the_reference_codes(model):
    """Every parameter of primal_attention/d4rl's DT (the reproduction shapes) is drawn as
    PrimalAttention_RL / Flowformer_RL draw it: the attention layers with the GPT-2 stack's init."""
    cfg = compose(["experiment=primal_attention/d4rl", f"model={model}"])
    task = task_class("d4rl")(cfg.task, "/nonexistent")
    task.setup_synthetic(3 * int(cfg.task.context_len))
    torch.manual_seed(0)
    net = task.build_model(cfg.model)
    names = [n for n, _ in net.named_parameters()]
    if model == "primal_plus":
        assert {"decoder.layers.2.attention.we", "decoder.layers.2.attention.concat_proj.weight"} <= set(names)
    for name, p in net.named_parameters():
        owner_name, attribute = name.rsplit(".", 1)
        rule = reference_init_rule(net.get_submodule(owner_name), attribute, inside_gpt2=name.startswith("decoder."))
        assert_drawn_by(p, rule, name)


def test_fetcher_downloads_to_d4rl_file_name_with_checksum(workdir, monkeypatch, tmp_path):
    from attnbench.tasks import d4rl

    src = hand_made(tmp_path / "src" / "hopper_medium-v2.hdf5")
    monkeypatch.setattr(d4rl, "D4RL_URL", src.parent.as_uri() + "/{file}")
    main(["data", "d4rl", "hopper-medium-v2"])
    target = workdir / "data" / "d4rl" / "hopper_medium-v2.hdf5"
    assert target.is_file() and (target.parent / "hopper_medium-v2.hdf5.sha256").is_file()
    assert fetcher("d4rl").status("hopper-medium-v2", workdir / "data") == "local"


def record_d4rl_layout(path, env_name="Hopper-v4", episodes=12, steps=60, noise=0.05):
    """A small dataset in D4RL's HDF5 layout, recorded from a real gymnasium MuJoCo environment by a
    fixed policy plus a little noise, a = clip(tanh(W s) + noise): the action is (almost) a function
    of the state, which a learning model can predict. W skips s[0] (the torso height, nearly
    constant), so the actions vary."""
    import gymnasium as gym

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(env_name, max_episode_steps=steps)
    rng = np.random.RandomState(0)
    weights = rng.randn(env.action_space.shape[0], env.observation_space.shape[0])
    weights[:, 0] = 0.0
    cols = {k: [] for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
    for ep in range(episodes):
        obs, _ = env.reset(seed=ep)
        done = False
        while not done:
            a = np.clip(np.tanh(weights @ obs) + noise * rng.randn(len(weights)), -1, 1).astype(np.float32)
            nxt, r, term, trunc, _ = env.step(a)
            for k, v in zip(cols, (obs, a, r, term, trunc)):
                cols[k].append(v)
            obs, done = nxt, term or trunc
    env.close()
    return write_hdf5(path, **{k: np.asarray(v, dtype=np.float32 if k in ("observations", "actions", "rewards") else bool)
                               for k, v in cols.items()})


@pytest.mark.slow
def test_end_to_end_on_a_dataset_recorded_from_mujoco(workdir):
    """The whole run learns the recorder's policy: the training loss (action MSE) falls far below
    the actions' variance (what predicting their mean gives); then the rollouts are recorded."""
    import h5py

    path = record_d4rl_layout(workdir / "data" / "d4rl" / "hopper-recorded-v2.hdf5")
    with h5py.File(path) as f:
        mean_prediction_mse = float(np.var(f["actions"][:], axis=0).mean())  # 0.22; the noise's 0.0025
    main(["run", "task=d4rl", "task.dataset=hopper-recorded-v2", "model=primal_plus",
          "+per_dataset.data_dependent.primal_plus.hopper-recorded-v2=false", "task.backbone.d_model=16",
          "task.backbone.d_ff=32", "task.backbone.n_heads=2", "task.backbone.dropout=0", "task.backbone.attention_dropout=0",
          "trainer.max_steps=100", "trainer.eval_every_steps=25", "trainer.batch_size=16", "trainer.optimizer.lr=1e-2",
          "trainer.scheduler.warmup_steps=10", "task.eval.test_episodes=2", "task.eval.val_episodes=1",
          "task.eval.max_episode_steps=30", "seed=0", "trainer.progress=false", "results.path=res.csv", "measure.flops=false",
          "measure.memory=false"])
    row = read_records("res.csv")[-1]
    history = json.loads(row["metrics_json"])["history"]
    losses = [h["train_loss"] for h in history]
    assert [h["step"] for h in history] == [25, 50, 75, 100]
    assert losses[-1] < 0.2 * mean_prediction_mse and losses[-1] < 0.5 * losses[0], (losses, mean_prediction_mse)
    assert row["status"] == "ok" and row["metric"] == "normalized_return" and row["higher_is_better"] == "True"
    assert int(row["steps_run"]) == 100 and int(float(row["test_episodes"])) == 2
    assert float(row["test_normalized_return"]) == float(row["test_normalized_return_3600"]) == float(row["test_score"])
    assert float(row["test_normalized_return"]) == pytest.approx(float(normalized_score("hopper", float(row["test_return"]))))
    assert "test_normalized_return_1800" in row and 0 < float(row["test_episode_length_3600"]) <= 30
    assert float(row["test_normalized_return_target2"]) == float(row["test_normalized_return_1800"])
    facts = json.loads(row["metrics_json"])["data"]
    assert facts["environment"].startswith("gymnasium Hopper-v4") and facts["trajectories"] == 12
    # without eval_every_steps the preset evaluates once, at the last step (the code's final evaluation)
    assert compose(["task=d4rl", "trainer.max_steps=200"]).trainer.eval_every_steps == 200


def test_a_broken_or_incomplete_hdf5_is_one_line_naming_the_file(workdir, capsys):
    """A file of garbage bytes under the dataset's name (a broken download) and a valid HDF5 that
    lacks an array: one line each, naming the file and how to fetch it again, exit 2."""
    path = workdir / "data" / "d4rl" / "hopper-broken-v2.hdf5"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not hdf5\x00" * 64)
    run = ["run", "task=d4rl", "task.dataset=hopper-broken-v2", "trainer.max_steps=1", "trainer.progress=false",
           "results.path=res.csv"]
    for expected in ("is not a readable HDF5 file", "no rewards (a D4RL v2 file has"):
        with pytest.raises(SystemExit) as e:
            main(run)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, err
        assert str(path) in err[0] and expected in err[0] and "attnbench data d4rl hopper-broken-v2" in err[0]
        assert "'" not in err[0].split(": ", 2)[-1].split("(")[0]  # no stray quotes around the key
        write_hdf5(path, observations=np.zeros((4, 2), np.float32), actions=np.zeros((4, 1), np.float32),
                   terminals=np.zeros(4, bool), timeouts=np.ones(4, bool))
