"""D4RL v2 gym-mujoco datasets (Fu et al. 2020) prepared as the Primal-Attention RL code does it
(PrimalAttention_RL is thuml/Flowformer's Flowformer_RL: data/download_d4rl_datasets.py,
data/context_dataset.py).

- HDF5 keys ``observations`` (N, s), ``actions`` (N, a), ``rewards`` (N,), ``terminals``,
  ``timeouts`` (N,). Trajectories end at every step with ``terminals | timeouts`` (that step
  included); steps after the last end belong to no trajectory and are dropped.
- States are standardised with the mean and std (+1e-6) of every kept step.
- Every (trajectory, start) pair is a sample: K = 20 steps from the start, right-padded (state 0
  before standardisation -- the code pads, then standardises the whole window --, action -10,
  mask 0); returns-to-go (undiscounted sums of the rewards from each step to the trajectory's end,
  K + 1 values, 0 past the end) divided by ``reward_scale`` (1000); timesteps are the steps'
  indices in the trajectory, clipped at max_ep_len - 1 = 999, padding 0.
- Normalised score = 100 (R - R_random) / (R_expert - R_random) with D4RL's reference returns.

Samples are cut from the flat arrays when read (the 2M-step sets would take gigabytes as
precomputed windows; the values are the same).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bench_cli.core.errors import UserError
from bench_cli.core.extras import require

HDF5_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
ENVS = ("halfcheetah", "hopper", "walker2d")
LEVELS = ("medium", "medium-replay", "medium-expert")
D4RL_DATASETS = tuple(f"{env}-{level}-v2" for level in ("medium-expert", "medium", "medium-replay") for env in ENVS)
# D4RL infos.REF_MIN_SCORE / REF_MAX_SCORE of the v2 gym-mujoco sets (the same for every level of an env).
REF_SCORES = {"halfcheetah": (-280.178953, 12135.0), "hopper": (-20.272305, 3234.3), "walker2d": (1.629008, 4592.3)}
ACTION_PAD = -10.0


def env_of(dataset: str) -> str | None:
    """The environment a dataset name starts with (halfcheetah-medium-v2 -> halfcheetah)."""
    head = dataset.split("-", 1)[0]
    return head if head in ENVS else None


def d4rl_filename(dataset: str) -> str:
    """D4RL's file name: halfcheetah-medium-replay-v2 -> halfcheetah_medium_replay-v2.hdf5."""
    env, rest = dataset.split("-", 1)
    level, version = rest.rsplit("-", 1)
    return f"{env}_{level.replace('-', '_')}-{version}.hdf5"


def normalized_score(env: str, returns) -> np.ndarray:
    low, high = REF_SCORES[env]
    return 100.0 * (np.asarray(returns, dtype=np.float64) - low) / (high - low)


def read_hdf5(path: Path, dataset: str = "") -> dict[str, np.ndarray]:
    """The D4RL v2 arrays of ``path``; a file that is not HDF5 (a broken download) or lacks an array
    is a one-line UserError naming the file and how to fetch it again."""
    h5py = require("h5py", "rl", "task=d4rl")
    again = f"`attnbench data d4rl {dataset or 'NAME'}`"
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        reason = str(e).split("(")[-1].rstrip(")") if "(" in str(e) else str(e)
        raise UserError(f"{path} is not a readable HDF5 file ({reason}); fetch it again with {again}") from None
    with f:
        missing = [k for k in HDF5_KEYS if k not in f]
        if missing:
            raise UserError(f"{path}: no {', '.join(missing)} (a D4RL v2 file has {', '.join(HDF5_KEYS)}); "
                            f"fetch it again with {again}")
        return {k: np.asarray(f[k]) for k in HDF5_KEYS}


def trajectory_bounds(terminals: np.ndarray, timeouts: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each trajectory, end exclusive: split after every terminal or timeout step."""
    ends = np.flatnonzero(np.asarray(terminals, bool) | np.asarray(timeouts, bool)) + 1
    starts = np.concatenate([[0], ends[:-1]])
    return [(int(s), int(e)) for s, e in zip(starts, ends)]


def returns_to_go(rewards: np.ndarray, bounds) -> np.ndarray:
    """Undiscounted reward sums from each step to its trajectory's end (discount_cumsum, gamma 1)."""
    out = np.zeros(len(rewards), dtype=np.float64)
    for s, e in bounds:
        out[s:e] = np.cumsum(rewards[s:e][::-1].astype(np.float64))[::-1]
    return out


class TrajectoryWindows(Dataset):
    """Every (trajectory, start) window of ``context_len`` steps of a D4RL dataset."""

    def __init__(self, data: dict[str, np.ndarray], context_len: int = 20, max_ep_len: int = 1000,
                 reward_scale: float = 1000.0):
        self.bounds = trajectory_bounds(data["terminals"], data["timeouts"])
        if not self.bounds:
            raise ValueError("no trajectory ends (terminals | timeouts) in the dataset")
        keep = np.concatenate([np.arange(s, e) for s, e in self.bounds])
        self.observations = data["observations"].astype(np.float32)
        self.actions = data["actions"].astype(np.float32)
        self.state_mean = self.observations[keep].mean(0)
        self.state_std = self.observations[keep].std(0) + 1e-6
        self.rtg = returns_to_go(data["rewards"], self.bounds)
        self.context_len, self.max_ep_len, self.reward_scale = int(context_len), int(max_ep_len), float(reward_scale)
        # sample i -> (first step of its trajectory, start offset): one per kept step
        self.traj_start = np.concatenate([np.full(e - s, s) for s, e in self.bounds]).astype(np.int64)
        self.traj_end = np.concatenate([np.full(e - s, e) for s, e in self.bounds]).astype(np.int64)
        self.steps = keep.astype(np.int64)
        returns = np.array([data["rewards"][s:e].sum() for s, e in self.bounds])
        self.info = {"trajectories": len(self.bounds), "steps": int(len(keep)),
                     "return_mean": float(returns.mean()), "return_max": float(returns.max()),
                     "return_min": float(returns.min())}

    @property
    def state_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions.shape[1]

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int) -> dict:
        k, first, end = self.context_len, int(self.steps[i]), int(self.traj_end[i])
        n = min(k, end - first)
        states = np.zeros((k, self.state_dim), dtype=np.float32)
        states[:n] = self.observations[first:first + n]
        states = (states - self.state_mean) / self.state_std  # padding standardised too, as the code
        actions = np.full((k, self.act_dim), ACTION_PAD, dtype=np.float32)
        actions[:n] = self.actions[first:first + n]
        rtg = np.zeros((k + 1, 1), dtype=np.float32)
        m = min(n + 1, end - first)  # the step after the window when the trajectory has it, else 0
        rtg[:m, 0] = self.rtg[first:first + m] / self.reward_scale
        timesteps = np.zeros(k, dtype=np.int64)
        timesteps[:n] = np.minimum(np.arange(first, first + n) - self.traj_start[i], self.max_ep_len - 1)
        mask = np.zeros(k, dtype=bool)
        mask[:n] = True
        return {"states": torch.from_numpy(states.astype(np.float32)), "actions": torch.from_numpy(actions),
                "rtg": torch.from_numpy(rtg), "timesteps": torch.from_numpy(timesteps), "mask": torch.from_numpy(mask)}
