"""`attnbench bench-overhead` (`make bench-overhead`): what the harness adds to a job (issue 21).

For each case (UEA BasicMotions and JapaneseVowels as primal-dual Table 1 runs them, generated LRA
ListOps, the mnist5k ViT; small budgets) one invocation times, alternating A B A B and keeping the
best of ``--repeats``:

(a) a bare PyTorch loop (``BareLoop``) in its own process, built from the SAME composed config: the
    task's data and loaders, the project's model and objective, the optimiser and schedule of
    bench_cli/optim.py, gradient clipping, the training-batch metrics when the config asks for
    them, and the same evaluations (the protocol's selecting split at the points the schedule
    evaluates, the reported TEST evaluations at the end), with no measurement, records, logging,
    progress or validation;
(b) `attnbench run` with the same overrides, as a subprocess, and its record's ``train_time_s``.

Both are timed as whole processes by the caller (imports, composition, data loading included);
"train" is the training passes without the evaluations, as the record's ``train_time_s``. The bare
loop seeds, splits, builds and loads as the harness does, so both reach the same test metric: the
table shows it, which checks that the bare loop did the same work.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cli.core.files import write_atomically

# Small budgets: the whole benchmark (2 repeats, 4 cases) takes about 4 minutes on 2 idle cores.
# Every case runs on one torch thread, as the sweeps' jobs do (JOBS=2 on 2 cores).
CASES = {
    "uea BasicMotions": ["experiment=primal_dual/table1", "task.dataset=BasicMotions", "model=softmax",
                         "trainer.step_budget=40"],  # 40 of 400 epochs, one step each
    "uea JapaneseVowels": ["experiment=primal_dual/table1", "task.dataset=JapaneseVowels", "model=softmax",
                           "trainer.step_budget=50"],  # 10 epochs of 5 steps
    "lra ListOps (generated)": ["task=lra_listops", "task.dataset=listops_generated", "task.max_len=500",
                                "task.seq_len=512", "trainer.max_steps=30", "trainer.eval_every_steps=10"],
    "vit mnist5k": ["task=vit", "task.dataset=mnist5k", "model=softmax", "trainer.max_epochs=3",
                    "task.subset.train=1024"],
}
COMMON = ["seed=0", "trainer.num_threads=1"]
# The generated ListOps the LRA case reads (small, short sequences: a CPU budget), made once
LISTOPS = {"num_train": 2000, "num_val": 500, "num_test": 500, "min_length": 100, "max_length": 500}


class BareLoop:
    """One training run of a composed config with nothing around it: the work a job must do."""

    def __init__(self, cfg):
        import torch

        from bench_cli.objective import Objective
        from bench_cli.trainer import seed_everything, select_device
        from tasks import task_class

        t = self.tcfg = cfg.trainer
        if t.get("num_threads"):
            torch.set_num_threads(int(t.num_threads))
        if str(t.get("precision", "32")) == "fp16" or t.early_stopping.get("patience") or \
                str(t.get("train_metrics")) == "evaluation" or str(t.get("strategy", "none")) != "none":
            from bench_cli.core.errors import UserError

            raise UserError("the bare loop runs fp32/bf16, single-process, without early stopping or train evaluation")
        self.device, self.seed = select_device(str(t.device)), int(cfg.seed)
        self.task = task_class(cfg.task.name)(cfg.task, cfg.paths.data_root)
        self.protocol = str(cfg.task.get("protocol", "holdout"))
        self.rule = self.task.resolve_protocol(self.protocol)  # the split that selects, best or last
        seed_everything(self.seed, bool(t.deterministic))
        self.task.setup(self.protocol)
        seed_everything(self.seed, bool(t.deterministic))
        self.model = self.task.build_model(cfg.model).to(self.device)
        self.objective = Objective.of(self.task, cfg.model)

    def loader(self, split: str, train: bool):
        """The trainer's loader: its own seeded generator, the task's sampler and collate."""
        import torch
        from torch.utils.data import DataLoader

        from bench_cli.trainer import seed_worker

        t, g = self.tcfg, torch.Generator().manual_seed(self.seed)
        bs = int(t.batch_size if train else t.eval_batch_size)
        if train and t.get("micro_batch_size"):
            bs = min(bs, int(t.micro_batch_size))
        dataset = self.task.dataset(split)
        sampler = self.task.sampler(split, dataset, g)
        workers = int(t.get("num_workers") or 0)
        return DataLoader(dataset, batch_size=bs, shuffle=train and sampler is None, sampler=sampler, generator=g,
                          collate_fn=self.task.collate(split), num_workers=workers,
                          drop_last=train and bool(t.get("drop_last", False)),
                          worker_init_fn=seed_worker if workers else None)

    def evaluate(self, split: str) -> dict:
        from bench_cli.core.task import EvalContext
        from bench_cli.trainer import autocast

        with autocast(self.device, str(self.tcfg.get("precision", "32"))):
            return self.task.evaluate(self.model, split, EvalContext(lambda s: self.loader(s, False), self.device))

    def optimisation(self, n_batches: int, batch_size: int):
        from bench_cli.optim import make_optimizer, make_scheduler, parameter_groups
        from bench_cli.trainer import plan_schedule

        t = self.tcfg
        accum = max(1, int(t.get("accumulate_grad_batches", 1)))
        if t.get("micro_batch_size"):
            accum *= math.ceil(int(t.batch_size) / batch_size)
        plan = plan_schedule(t, n_batches, accum)
        reference = t.optimizer.get("lr_reference_batch")
        params = parameter_groups(self.model, float(t.optimizer.get("weight_decay", 0.0)),
                                  bool(t.optimizer.get("no_decay_1d", False)))
        opt = make_optimizer(params, t.optimizer, int(t.batch_size) / float(reference) if reference else 1.0)
        return plan, opt, make_scheduler(opt, t.scheduler, plan.total_steps, plan.steps_per_epoch)

    def fit(self) -> dict:
        """Train on the config's schedule; returns the reported test metric and the train seconds."""
        import torch

        from bench_cli.core import metrics as M
        from bench_cli.core.task import to_device
        from bench_cli.trainer import autocast

        loader = self.loader("train", train=True)
        plan, opt, sched = self.optimisation(len(loader), loader.batch_size)
        clip, precision = self.tcfg.get("grad_clip"), str(self.tcfg.get("precision", "32"))
        batch_metrics = str(self.tcfg.get("train_metrics")) in ("True", "batches")
        self.best, self.losses, stats, step, train_s = None, [], {}, 0, 0.0
        for epoch in range(1, plan.epochs + 1):
            self.model.train()
            started = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(loader):
                batch = to_device(batch, self.device)
                with autocast(self.device, precision):
                    out = self.model(**self.task.model_inputs(batch))
                    loss = self.objective(self.model, out, batch)
                (loss / plan.accum).backward()
                self.losses.append(loss.detach())
                if batch_metrics:
                    with torch.no_grad():
                        M.accumulate(stats, self.task.batch_stats(out.detach().float(), batch))
                if (i + 1) % plan.accum and i + 1 < len(loader):
                    continue
                if clip:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(clip))
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if sched is not None and step < plan.total_steps:
                    sched.step()
                if plan.evaluates_at_step(step):
                    train_s += time.perf_counter() - started
                    self.select(epoch, step, stats)
                    self.model.train()
                    started = time.perf_counter()
                if step >= plan.total_steps:
                    break
            train_s += time.perf_counter() - started
            if plan.evaluates_after(epoch):
                self.select(epoch, step, stats)
            if step >= plan.total_steps:
                break
        return {"train_s": train_s, **self.reported(step)}

    def select(self, epoch: int, step: int, stats: dict) -> None:
        """The protocol's selecting split evaluated; the best weights so far kept (a device copy)."""
        from bench_cli.core import metrics as M

        split = self.rule.selects
        train_loss = sum(torch_values(self.losses)) / max(len(self.losses), 1)  # read once per evaluation
        self.losses = []
        if stats:
            M.compute_all(self.task.metrics, stats)
            stats.clear()
        metrics = self.evaluate(split)
        key = M.selection_key(self.task.selection_metric(), metrics, self.task.loss_metric())
        if self.best is None or key > self.best["key"] or self.rule.keeps == "last":
            weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.best = {"key": key, "at": (epoch, step), "weights": weights, "metrics": metrics}
        self.last = {"at": (epoch, step), "metrics": metrics, "train_loss": train_loss}

    def reported(self, step: int) -> dict:
        """The test metric the record reports: the best TEST evaluation (paper), or TEST of the selected
        weights (holdout, after TEST of the last ones)."""
        metric = self.task.selection_metric().name
        if not self.rule.holds_out:
            return {"test": self.best["metrics"][metric]}
        last = self.evaluate("test")
        if self.best["at"] == self.last["at"] and self.last["at"][1] == step:
            return {"test": last[metric]}
        self.model.load_state_dict(self.best["weights"])
        return {"test": self.evaluate("test")[metric]}


def torch_values(tensors: list) -> list[float]:
    import torch

    return torch.stack(tensors).tolist() if tensors else []


def bare_main(overrides: list[str]) -> None:
    """The bare process (``python -m bench_cli.profile.overhead OVERRIDES``): one JSON line."""
    from bench_cli.compose import compose

    print(json.dumps(BareLoop(compose(overrides)).fit()))


# --- the side-by-side measurement -----------------------------------------------------------------
def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def bare(overrides: list[str], env: dict) -> dict:
    seconds, out = timed([sys.executable, "-m", "bench_cli.profile.overhead", *overrides], env)
    return {"process_s": seconds, **json.loads(out.strip().splitlines()[-1])}


def harness(overrides: list[str], env: dict, workdir: Path, metric: str = "test_score") -> dict:
    from bench_cli.records import read_records

    records = workdir / "records.csv"
    records.unlink(missing_ok=True)
    seconds, _ = timed([str(Path(sys.executable).with_name("attnbench")), "run", *overrides,
                        f"results.path={records}"], env)
    row = read_records(records)[-1]
    return {"process_s": seconds, "train_s": float(row["train_time_s"]), "test": float(row[metric]),
            "measure_s": float(row.get("measure_time_s") or "nan")}


def listops_root() -> Path:
    """A data root holding the small generated ListOps (made on the first use, then reused)."""
    from bench_cli.compose import cache_dir
    from tasks.lra.fetchers import ListOpsFetcher

    root = cache_dir() / "bench_overhead"
    ListOpsFetcher.generate(root, False, dict(LISTOPS))
    return root


def measure_case(name: str, overrides: list[str], repeats: int, workdir: Path) -> dict:
    """Best of ``repeats`` alternating (bare, harness) pairs of one case."""
    env = {**os.environ, "ATTNBENCH_OUTPUT": str(workdir / "outputs"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    if "task=lra_listops" in overrides:
        overrides = [*overrides, f"paths.data_root={listops_root()}"]
    overrides = [*overrides, *COMMON]
    runs = {"bare": [], "harness": []}
    for _ in range(repeats):
        runs["bare"].append(bare(overrides, env))
        runs["harness"].append(harness(overrides, env, workdir))
    best = {side: {k: min(r[k] for r in rs) for k in ("process_s", "train_s")} for side, rs in runs.items()}
    return {"case": name, **{f"{side}_{k}": v for side, b in best.items() for k, v in b.items()},
            "bare_test": runs["bare"][0]["test"], "harness_test": runs["harness"][0]["test"],
            "measure_first_s": runs["harness"][0]["measure_s"], "measure_reused_s": runs["harness"][-1]["measure_s"]}


def render(rows: list[dict]) -> None:
    from bench_cli.ui import show_table

    headers = ["family", "bare process s", "harness process s", "ratio", "bare train s", "harness train s", "ratio",
               "measure s (first / reused)", "same test metric"]
    show_table("attnbench run vs a bare loop of the same config (best of the alternating pairs)", headers,
               [[r["case"], f"{r['bare_process_s']:.2f}", f"{r['harness_process_s']:.2f}",
                 f"{r['harness_process_s'] / r['bare_process_s']:.3f}", f"{r['bare_train_s']:.2f}",
                 f"{r['harness_train_s']:.2f}", f"{r['harness_train_s'] / r['bare_train_s']:.3f}",
                 f"{r['measure_first_s']:.2f} / {r['measure_reused_s']:.2f}", "yes" if r["bare_test"] == r["harness_test"] else
                 f"no ({r['bare_test']} vs {r['harness_test']})"] for r in rows])


def main(args: list[str]) -> None:
    """`attnbench bench-overhead [--repeats N] [--cases NAME,...] [--out FILE]`."""
    from bench_cli.args import parse
    from bench_cli.core.errors import unknown_choice

    p = parse("bench-overhead", args, {"--repeats": True, "--cases": True, "--out": True}, positional=False)
    names = [n.strip() for n in str(p.get("--cases", ",".join(CASES))).split(",") if n.strip()]
    for n in names:
        if n not in CASES:
            raise unknown_choice("case", n, CASES)
    with tempfile.TemporaryDirectory(prefix="attnbench-overhead-") as tmp:
        rows = [measure_case(n, [*CASES[n], *p.overrides], int(p.get("--repeats", 2)), Path(tmp)) for n in names]
    render(rows)
    if p.get("--out"):
        write_atomically(Path(p.get("--out")), json.dumps(rows, indent=1))


if __name__ == "__main__":
    bare_main(sys.argv[1:])
