"""Return-conditioned rollouts of a Decision Transformer in gymnasium MuJoCo environments
(evaluate_episode_rtg of the Primal-Attention / Flowformer / decision-transformer code).

An episode starts at the target return-to-go R / scale; at step t the model sees the last K
states (standardised with the dataset's statistics), actions (the current one zero), returns-to-go
and timesteps, and its action for the current state is applied; the return-to-go then drops by
reward / scale. Episodes end on termination or truncation (gymnasium's TimeLimit: 1000 steps, the
code's max_ep_len). The n episodes of one evaluation step in lockstep, one batched forward per
step (they all have the same history length; finished ones drop out), each from its own seed.

Environments: gymnasium's ``<Env>-v4`` (``gymnasium[mujoco]``), which use the same MuJoCo models as
the ``-v3`` environments of D4RL and the reference code (mujoco-py).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from bench_cli.core.extras import require

ENV_IDS = {"halfcheetah": "HalfCheetah", "hopper": "Hopper", "walker2d": "Walker2d"}


def env_id(env: str, version: str = "v4") -> str:
    return f"{ENV_IDS[env]}-{version}"


def make_env(env: str, version: str = "v4", max_episode_steps: int | None = None):
    gym = require("gymnasium", "rl", "task=d4rl's rollouts")
    with warnings.catch_warnings():  # "-v4 is out of date": v4 is the D4RL-era model, on purpose
        warnings.simplefilter("ignore")
        return gym.make(env_id(env, version), max_episode_steps=max_episode_steps)


def environment_versions() -> dict:
    why = "task=d4rl's rollouts"
    return {m: require(m, "rl", why).__version__ for m in ("gymnasium", "mujoco")}


@torch.no_grad()
def rollouts(model, env: str, seeds: list[int], target_return: float, *, state_mean, state_std, context_len: int,
             scale: float = 1000.0, max_ep_len: int = 1000, version: str = "v4", device="cpu",
             max_episode_steps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of one episode per seed, conditioned on ``target_return``."""
    envs = [make_env(env, version, max_episode_steps) for _ in seeds]
    n, horizon = len(envs), min(max_ep_len, max_episode_steps or max_ep_len)
    first = [e.reset(seed=int(s))[0] for e, s in zip(envs, seeds)]
    sd, ad = first[0].shape[0], envs[0].action_space.shape[0]
    mean = torch.as_tensor(state_mean, dtype=torch.float32, device=device)
    std = torch.as_tensor(state_std, dtype=torch.float32, device=device)
    states = torch.zeros(n, horizon + 1, sd, device=device)
    actions = torch.zeros(n, horizon, ad, device=device)
    rtg = torch.zeros(n, horizon + 1, 1, device=device)
    states[:, 0] = torch.as_tensor(np.stack(first), dtype=torch.float32, device=device)
    rtg[:, 0] = target_return / scale
    timesteps = torch.arange(horizon + 1, device=device).clamp(max=max_ep_len - 1)
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    model.eval()
    for t in range(horizon):
        idx = np.flatnonzero(active)
        if not len(idx):
            break
        lo = max(0, t + 1 - context_len)
        sel = torch.as_tensor(idx, device=device)
        pred = model(states=(states[sel, lo:t + 1] - mean) / std, actions=actions[sel, lo:t + 1],
                     returns_to_go=rtg[sel, lo:t + 1], timesteps=timesteps[lo:t + 1].expand(len(idx), -1))[:, -1]
        # Under the evaluation's bf16 / fp16 autocast (trainer.precision) the action head's output
        # is half precision: the history buffer (float32, what the next step's model reads) sets
        # the dtype, and numpy, which the environment steps with, has no bfloat16.
        pred = pred.to(actions.dtype)
        actions[sel, t] = pred
        for j, a in zip(idx, pred.cpu().numpy()):
            obs, reward, terminated, truncated, _ = envs[j].step(a)
            states[j, t + 1] = torch.as_tensor(obs, dtype=torch.float32, device=device)
            rtg[j, t + 1] = rtg[j, t] - float(reward) / scale
            returns[j] += float(reward)
            lengths[j] += 1
            if terminated or truncated:
                active[j] = False
    for e in envs:
        e.close()
    return returns, lengths
