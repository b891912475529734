"""Offline RL on D4RL with a Decision Transformer (`task=d4rl`, D4RL-normalised return, higher is
better): Primal-Attention main Table 5 and supplement Table 2, as PrimalAttention_RL runs them.

Data: the D4RL v2 gym-mujoco HDF5 files under ``<data root>/d4rl/``, by D4RL's file name
(``hopper_medium-v2.hdf5``, what ``attnbench data d4rl NAME`` downloads from D4RL's location) or by
the dataset name (``hopper-medium-v2.hdf5``); any other ``<env>-<name>.hdf5`` there (env halfcheetah,
hopper, walker2d) is a dataset too. Preprocessing: tasks/d4rl/data.py. Model:
models/decision_transformer.py. Evaluation (a task-owned evaluator): rollouts in gymnasium's MuJoCo
``-v4`` environments conditioned on each target return (hopper 3600/1800, halfcheetah 12000/6000,
walker2d 5000/2500), ``test_episodes`` (100) episodes per target at the end; ``val_episodes`` (10, the
code's intermediate evaluations) on other seeds select under the holdout protocol; the
reproduction configs run the ``paper`` protocol with ``paper_selection: last``, as the code reports
the final iteration's 100 episodes (its logs print every iteration, none is selected). The code
evaluates and logs the D4RL-normalised return of every target and the paper does not say which it
printed: ``normalized_return`` (the default, the one that selects) is the first target's,
``normalized_return_target2`` the second's (the same position on every environment, so a report
can show both columns); each is also recorded by its value (``normalized_return_<target>``), and
the environment versions are in the record's data facts.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch.utils.data import RandomSampler

from bench_cli.core.metrics import compute_all, Mean
from bench_cli.core.errors import DataNotFoundError, UserError, unknown_choice
from attnbench.tasks import register_task
from bench_cli.core.task import Task
from attnbench.tasks.d4rl.data import (D4RL_DATASETS, REF_SCORES, TrajectoryWindows, d4rl_filename, env_of,  # noqa: F401
                             normalized_score, read_hdf5)
from attnbench.tasks.data import download
from bench_cli.core.fetch import Fetcher, register_fetcher

D4RL_URL = "http://rail.eecs.berkeley.edu/datasets/offline_rl/gym_mujoco_v2/{file}"
# Seeds of the evaluation episodes: test episode i starts from seed TEST_SEED + i, validation
# episodes from VAL_SEED + i (disjoint).
TEST_SEED, VAL_SEED = 100, 100_000


def d4rl_root(data_root: Path) -> Path:
    return Path(data_root).expanduser() / "d4rl"


def dataset_file(dataset: str, data_root: Path) -> Path | None:
    root = d4rl_root(data_root)
    for name in (f"{dataset}.hdf5", *([d4rl_filename(dataset)] if env_of(dataset) and "-" in dataset else [])):
        if (root / name).is_file():
            return root / name
    return None


def expected_file(dataset: str, data_root: Path) -> Path:
    """Where a dataset's HDF5 goes: D4RL's file name for its nine, ``<name>.hdf5`` for others."""
    return d4rl_root(data_root) / (d4rl_filename(dataset) if dataset in D4RL_DATASETS else f"{dataset}.hdf5")


@register_task
class D4RLTask(Task):
    name = "d4rl"
    fetcher = "d4rl"
    metrics = (Mean("normalized_return"), Mean("return"))
    selection = "normalized_return"

    def __init__(self, cfg, data_root):
        super().__init__(cfg, data_root)
        self.windows: TrajectoryWindows | None = None
        self.env = env_of(self.dataset_name)
        self.state_dim = self.act_dim = None

    # --- data -------------------------------------------------------------------------------
    def make_splits(self, protocol: str) -> None:
        path = self.located  # the HDF5 file the fetcher found
        data = read_hdf5(path, self.dataset_name)
        self.source = path
        self.windows = TrajectoryWindows(data, int(self.cfg.context_len), int(self.cfg.max_ep_len),
                                         float(self.cfg.reward_scale))
        self.state_dim, self.act_dim = self.windows.state_dim, self.windows.act_dim
        self.splits = {"train": self.windows}

    def sampler(self, split: str, dataset, generator: torch.Generator):
        """Windows drawn uniformly with replacement (the code's RandomSampler(replacement=True));
        an 'epoch' is len(dataset) draws, the budget is in optimiser steps."""
        if split != "train":
            return None
        return RandomSampler(dataset, replacement=True, num_samples=len(dataset), generator=generator)

    # --- shapes without data ----------------------------------------------------------------------
    def setup_synthetic(self, seq_len: int) -> None:
        syn = self.cfg.synthetic
        self.state_dim, self.act_dim, self.splits = int(syn.state_dim), int(syn.act_dim), {}
        self.synthetic_len = max(1, math.ceil(seq_len / 3))  # timesteps: 3 tokens each

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        g = torch.Generator().manual_seed(0)
        k = max(1, math.ceil(seq_len / 3))
        batch = {"states": torch.randn(batch_size, k, self.state_dim, generator=g),
                 "actions": torch.rand(batch_size, k, self.act_dim, generator=g) * 2 - 1,
                 "rtg": torch.rand(batch_size, k + 1, 1, generator=g),
                 "timesteps": torch.arange(k).expand(batch_size, k).clone(),
                 "mask": torch.ones(batch_size, k, dtype=torch.bool)}
        return {key: v.to(device) for key, v in batch.items()}

    # --- model --------------------------------------------------------------------------------------
    def build_model(self, model_cfg):
        from attnbench.models.decision_transformer import build_decision_transformer

        if not self.state_dim:
            raise UserError("d4rl: call setup() or setup_synthetic() before build_model()")
        return build_decision_transformer(model_cfg, self.cfg.backbone, self.state_dim, self.act_dim,
                                          int(self.cfg.context_len), int(self.cfg.max_ep_len))

    def attention_stacks(self) -> dict[str, int]:
        return {"decoder": int(self.cfg.backbone.n_layers)}

    def model_inputs(self, batch: dict) -> dict:
        return {"states": batch["states"], "actions": batch["actions"], "returns_to_go": batch["rtg"][:, :-1],
                "timesteps": batch["timesteps"]}

    def loss(self, output, batch):
        """Mean squared action error over the real (unpadded) steps (the code's loss_fn)."""
        mask = batch["mask"]
        return torch.mean((output[mask] - batch["actions"][mask]) ** 2)

    # --- evaluation ---------------------------------------------------------------------------------
    def evaluated_splits(self, protocol: str) -> tuple[str, ...]:
        return ()  # rollouts in the environment: 'val' and 'test' are seeds of episodes, not data

    def targets(self) -> list[float]:
        return [float(t) for t in self.cfg.target_returns[self.env]]

    @torch.no_grad()
    def evaluate(self, model, split, ctx):
        from attnbench.tasks.d4rl.rollout import rollouts

        ev = self.cfg.eval
        n = int(ev.val_episodes if split == "val" else ev.test_episodes)
        first = VAL_SEED if split == "val" else TEST_SEED
        seeds = [first + int(ev.seed_offset) + i for i in range(n)]
        out = {}
        for i, target in enumerate(self.targets()):
            returns, lengths = rollouts(
                model, self.env, seeds, target, state_mean=self.windows.state_mean, state_std=self.windows.state_std,
                context_len=int(self.cfg.context_len), scale=float(self.cfg.reward_scale),
                max_ep_len=int(self.cfg.max_ep_len), version=str(ev.env_version), device=ctx.device,
                max_episode_steps=ev.get("max_episode_steps"))
            scores = normalized_score(self.env, returns)
            tag = f"{target:g}"
            out.update({f"normalized_return_{tag}": float(scores.mean()), f"normalized_return_std_{tag}": float(scores.std()),
                        f"return_{tag}": float(returns.mean()), f"episode_length_{tag}": float(lengths.mean())})
            if i == 0:  # the default reported number: the first target's
                stats = {**Mean("normalized_return").update(None, {"normalized_return": scores}),
                         **Mean("return").update(None, {"return": returns})}
                out.update(compute_all(self.metrics, stats))
            else:  # by position: the columns of a table over environments with different targets
                out[f"normalized_return_target{i + 1}"] = out[f"normalized_return_{tag}"]
            ctx.advance()
        out["episodes"] = n
        return out

    def describe(self) -> dict:
        out = {"source": str(getattr(self, "source", "synthetic")), "env": self.env}
        if self.windows is not None:
            from attnbench.tasks.d4rl.rollout import env_id, environment_versions

            out.update(self.windows.info, samples=len(self.windows), state_dim=self.state_dim, act_dim=self.act_dim,
                       environment=f"gymnasium {env_id(self.env, str(self.cfg.eval.env_version))} (MuJoCo models of "
                                   f"D4RL's -v3 environments)", **environment_versions(),
                       target_returns=self.targets(), reference_scores=list(REF_SCORES[self.env]))
        return out


@register_fetcher
class D4RLFetcher(Fetcher):
    """The D4RL v2 gym-mujoco HDF5 files from D4RL's location (sha256 recorded beside each)."""

    name = "d4rl"
    summary = "D4RL v2 gym-mujoco HDF5 (halfcheetah|hopper|walker2d x medium|medium-replay|medium-expert)"

    def datasets(self, data_root: Path | None = None) -> list[str]:
        """D4RL's nine sets, and every other ``<env>-<name>.hdf5`` under <data root>/d4rl/."""
        names = list(D4RL_DATASETS)
        root = d4rl_root(data_root) if data_root else None
        if root and root.is_dir():
            official = {d4rl_filename(d) for d in D4RL_DATASETS}
            names += sorted(p.stem for p in root.glob("*.hdf5")
                            if p.name not in official and p.stem not in names and env_of(p.stem))
        return names

    def status(self, dataset: str, data_root: Path) -> str:
        return "local" if dataset_file(dataset, data_root) else "missing"

    def location(self, dataset: str, data_root: Path) -> str:
        return str(dataset_file(dataset, data_root) or expected_file(dataset, data_root))

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        where = expected_file(dataset, data_root)
        return (f"D4RL dataset '{dataset}' not found: put it at {where}"
                + (f" (`attnbench data d4rl {dataset}` downloads it)" if dataset in D4RL_DATASETS else ""))

    def require(self, dataset: str, data_root: Path, *, cached=(), **options) -> Path:
        """The HDF5 file; any ``<env>-<name>`` of a known environment may be put there by hand."""
        if env_of(dataset) is None:
            raise unknown_choice("d4rl dataset", dataset, self.datasets(data_root))
        path = dataset_file(dataset, data_root)
        if path is None:
            raise DataNotFoundError(self.missing_message(dataset, data_root))
        return path

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        self.check_options(options)
        existing = dataset_file(dataset, data_root)
        if existing and not force:
            return existing
        target = d4rl_root(data_root) / d4rl_filename(dataset)
        url = D4RL_URL.format(file=target.name)
        print(f"downloading {url} ...", file=sys.stderr)
        download(url, target, what=f"D4RL {dataset}", where=str(target))
        return target
