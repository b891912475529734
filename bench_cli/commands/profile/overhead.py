"""`attnbench bench-overhead` (`make bench-overhead`): what the harness adds to a job.

For each case (UEA BasicMotions and JapaneseVowels as primal-dual Table 1 runs them, generated LRA
ListOps, the mnist5k ViT; small budgets; and, with ``--cases``, a whole Table 1 job) one invocation
runs ``--repeats`` alternating pairs, A B A B, each side a whole process timed from exec to exit:

(a) a bare PyTorch loop (``BareLoop``, ``python -m bench_cli.commands.profile.overhead CONFIG.yaml``) of the
    SAME config, composed and resolved once by the caller and loaded as plain YAML (no Hydra): the
    task's data and loaders, the project's model and objective, the optimiser and schedule of
    bench_cli/engine/optim.py, gradient clipping, the training-batch metrics when the config asks for
    them, and the same evaluations (the protocol's selecting split at the points the schedule
    evaluates, the reported TEST evaluations at the end), with no validation, measurement,
    records, logging or progress;
(b) `attnbench run` with the same overrides, and its record's ``train_time_s``.

Both report their stages (bench_cli.core.phases: the harness in its run folder's ``phases.json``),
so the difference outside training is split into startup (interpreter and imports), composition,
validation, data, model build, evaluations, measurement, record and exit. Medians of the pairs,
with the range of the pairs' ratios, wall and CPU seconds. The bare loop seeds, splits, builds and
loads as the harness does, so both reach the same test metric: the table shows it, which checks
that the bare loop did the same work.
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
from statistics import median

from bench_cli.core.files import write_atomically
from bench_cli.core.phases import Phases, process_age_s

# Small budgets: the whole benchmark (3 pairs, 4 cases) takes about 6 minutes on 2 idle cores.
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
# Opt-in (`--cases`): a whole job as the reproduction runs it (primal-dual Table 1, BasicMotions,
# softmax: its full step budget), the case the overhead targets name (~40 s a process here).
FULL_CASES = {"uea BasicMotions (Table 1 job)": ["experiment=primal_dual/table1", "task.dataset=BasicMotions",
                                                 "model=softmax"]}
COMMON = ["seed=0", "trainer.num_threads=1"]
# The generated ListOps the LRA case reads (small, short sequences: a CPU budget), made once
LISTOPS = {"num_train": 2000, "num_val": 500, "num_test": 500, "min_length": 100, "max_length": 500}


class BareLoop:
    """One training run of a composed config with nothing around it: the work a job must do."""

    def __init__(self, cfg):
        import torch

        from bench_cli.engine.env import seed_everything, select_device
        from attnbench.tasks import task_class

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
        self.model_cfg = cfg.model

    def build(self) -> None:
        from bench_cli.engine.objective import Objective
        from bench_cli.engine.env import seed_everything

        seed_everything(self.seed, bool(self.tcfg.deterministic))
        self.model = self.task.build_model(self.model_cfg).to(self.device)
        self.objective = Objective.of(self.task, self.model_cfg)

    def loader(self, split: str, train: bool):
        """The trainer's loader: its own seeded generator, the task's sampler and collate."""
        import torch
        from torch.utils.data import DataLoader

        from bench_cli.engine.env import seed_worker

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
        from bench_cli.engine.env import autocast

        with autocast(self.device, str(self.tcfg.get("precision", "32"))):
            return self.task.evaluate(self.model, split, EvalContext(lambda s: self.loader(s, False), self.device))

    def optimisation(self, n_batches: int, batch_size: int):
        from bench_cli.engine.optim import make_optimizer, make_scheduler, parameter_groups
        from bench_cli.engine.schedule import plan_schedule

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

        from bench_cli.core.metrics import accumulate
        from bench_cli.core.task import to_device
        from bench_cli.engine.env import autocast

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
                        accumulate(stats, self.task.batch_stats(out.detach().float(), batch))
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
        from bench_cli.core.metrics import compute_all, selection_key

        split = self.rule.selects
        train_loss = sum(torch_values(self.losses)) / max(len(self.losses), 1)  # read once per evaluation
        self.losses = []
        if stats:
            compute_all(self.task.metrics, stats)
            stats.clear()
        metrics = self.evaluate(split)
        key = selection_key(self.task.selection_metric(), metrics, self.task.loss_metric())
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


def bare_main(config_path: str) -> None:
    """The bare process (``python -m bench_cli.commands.profile.overhead CONFIG.yaml``): the run's config as
    the caller composed and resolved it, loaded as plain YAML (a script holds its settings; it
    does not compose them), then one JSON line: the test metric, the train seconds and the
    process's stages, as ``phases.json`` names the harness's."""
    from omegaconf import OmegaConf

    phases = Phases()
    phases.mark("startup", process_age_s())
    with phases("compose"):
        cfg = OmegaConf.load(config_path)
    with phases("data"):
        loop = BareLoop(cfg)
    with phases("model"):
        loop.build()
    with phases("fit"):
        out = loop.fit()
    print(json.dumps({**out, "phases": {**phases.as_dict(), "process_age_s": process_age_s()}}))


# --- the side-by-side measurement -----------------------------------------------------------------
def timed(cmd: list[str], env: dict) -> tuple[dict, str]:
    """Run ``cmd`` as a whole process: its wall seconds from exec to exit (the user's clock) and the
    CPU seconds it and its children used (less sensitive to other work on a shared machine)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"process_s": seconds, "cpu_s": cpu}, done.stdout


def bare(config: Path, env: dict) -> dict:
    times, out = timed([sys.executable, "-m", "bench_cli.commands.profile.overhead", str(config)], env)
    return {**times, **json.loads(out.strip().splitlines()[-1])}


def harness(overrides: list[str], env: dict, workdir: Path, metric: str = "test_score") -> dict:
    from bench_cli.results.csv_store import read_records

    records = workdir / "records.csv"
    records.unlink(missing_ok=True)
    times, _ = timed([str(Path(sys.executable).with_name("attnbench")), "run", *overrides,
                      f"results.path={records}"], env)
    row = read_records(records)[-1]
    phases = json.loads((Path(row["output_dir"]) / "phases.json").read_text())
    return {**times, "train_s": float(row["train_time_s"]), "test": float(row[metric]), "phases": phases}


def listops_root() -> Path:
    """A data root holding the small generated ListOps (made on the first use, then reused)."""
    from bench_cli.config.compose import cache_dir
    from attnbench.tasks.lra.fetchers import ListOpsFetcher

    root = cache_dir() / "bench_overhead"
    ListOpsFetcher.generate(root, False, dict(LISTOPS))
    return root


# The stages both processes go through, and the harness's own (validation, measurement, record);
# "exit" is the process's time after its last stage (interpreter shutdown, threads joined).
STAGES = ("startup", "compose", "validate", "data", "model", "fit", "resume", "checkpoint", "measure", "record", "exit")


def stages(side: dict) -> dict[str, float]:
    """Seconds per stage of one process; "fit" without its training passes, "exit" the rest."""
    phases = dict(side["phases"])
    out = {k: float(phases.get(k, 0.0)) for k in STAGES if k != "exit"}
    out["fit"] -= side["train_s"] + out["resume"] + out["checkpoint"]  # the evaluations and the loop's bookkeeping
    age = phases.get("process_age_s")
    out["exit"] = side["process_s"] - age if age is not None else float("nan")
    return out


def measure_case(name: str, overrides: list[str], repeats: int, workdir: Path) -> dict:
    """``repeats`` alternating (bare, harness) pairs of one case: medians, the spread of the pairs'
    process ratios, and the median time per stage of each side."""
    from omegaconf import OmegaConf

    from bench_cli.config.compose import compose

    env = {**os.environ, "ATTNBENCH_OUTPUT": str(workdir / "outputs"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    if "task=lra_listops" in overrides:
        overrides = [*overrides, f"paths.data_root={listops_root()}"]
    overrides = [*overrides, *COMMON]
    config = workdir / "bare_config.yaml"
    write_atomically(config, OmegaConf.to_yaml(compose(overrides), resolve=True))
    runs = {"bare": [], "harness": []}
    for _ in range(repeats):
        runs["bare"].append(bare(config, env))
        runs["harness"].append(harness(overrides, env, workdir))
    row = {"case": name, "pairs": repeats, "bare_test": runs["bare"][0]["test"], "harness_test": runs["harness"][0]["test"],
           "measure_first_s": runs["harness"][0]["phases"].get("measure", float("nan")),
           "measure_reused_s": runs["harness"][-1]["phases"].get("measure", float("nan"))}
    for side, rs in runs.items():
        for k in ("process_s", "cpu_s", "train_s"):
            row[f"{side}_{k}"] = median([r[k] for r in rs])
        row[f"{side}_stages"] = {st: median([stages(r)[st] for r in rs]) for st in STAGES}
    # the resume itself: a run that keeps its final checkpoint, then the same run again, which
    # continues from it (nothing left to train): its "resume" stage reads and restores everything
    kept = [*overrides, "trainer.checkpoint.keep_final=true", f"trainer.checkpoint.root={workdir / 'kept'}"]
    harness(kept, env, workdir)
    row["resume_s"] = harness(kept, env, workdir)["phases"].get("resume", float("nan"))
    ratios = [h["process_s"] / b["process_s"] for b, h in zip(runs["bare"], runs["harness"])]
    row["process_ratio"], row["process_ratio_range"] = median(ratios), (min(ratios), max(ratios))
    row["outside_train_s"] = {side: row[f"{side}_process_s"] - row[f"{side}_train_s"] for side in runs}
    return row


def render(rows: list[dict], load: tuple[tuple, tuple]) -> None:
    from bench_cli.core.spread import NOISY_NOTE
    from bench_cli.core.ui import console, show_table

    show_table("attnbench run vs a bare loop of the same config, whole processes (median of the pairs)",
               ["case", "bare s", "harness s", "process x", "pairs' range", "train x", "CPU x", "fixed cost +s",
                "same test metric"],
               [[r["case"], f"{r['bare_process_s']:.2f}", f"{r['harness_process_s']:.2f}", f"{r['process_ratio']:.3f}",
                 f"{r['process_ratio_range'][0]:.3f}-{r['process_ratio_range'][1]:.3f}",
                 f"{r['harness_train_s'] / r['bare_train_s']:.3f}", f"{r['harness_cpu_s'] / r['bare_cpu_s']:.3f}",
                 f"{r['outside_train_s']['harness'] - r['outside_train_s']['bare']:+.2f}",
                 "yes" if r["bare_test"] == r["harness_test"] else f"no ({r['bare_test']} vs {r['harness_test']})"]
                for r in rows])
    show_table("where the time outside training goes: harness - bare, seconds (median)",
               ["case", *STAGES],
               [[r["case"], *(f"{r['harness_stages'][st] - r['bare_stages'][st]:+.2f}" for st in STAGES)] for r in rows])
    show_table("checkpoints (on by default: one at every evaluation), harness median",
               ["case", "writes s", "% of training", "resume s"],
               [[r["case"], f"{r['harness_stages']['checkpoint']:.3f}",
                 f"{100 * r['harness_stages']['checkpoint'] / r['harness_train_s']:.2f}",
                 f"{r['resume_s']:.3f}"] for r in rows])
    console.print("stages: startup = exec to main (interpreter, imports); compose = Hydra (the bare loop loads the "
                  "resolved YAML); validate = the run's checks; data = task setup; model = build; fit = evaluations "
                  "and bookkeeping beyond the training passes; resume = looking for (and restoring) a checkpoint; "
                  "checkpoint = writing them; measure = FLOPs, memory (cached per shapes); "
                  "record = record.json and the CSV append; exit = after the last stage", soft_wrap=False)
    console.print(f"load average (1 min) {load[0][0]:.2f} before, {load[1][0]:.2f} after, on {os.cpu_count()} cores"
                  + (f"  [bold red]{NOISY_NOTE}[/]" if max(load[0][0], load[1][0]) > (os.cpu_count() or 1)
                     else ""))


def main(args: list[str]) -> None:
    """`attnbench bench-overhead [--repeats N] [--cases NAME,...] [--out FILE]`."""
    from bench_cli.config.args import parse
    from bench_cli.core.errors import unknown_choice

    p = parse("bench-overhead", args, {"--repeats": True, "--cases": True, "--out": True}, positional=False)
    cases = {**CASES, **FULL_CASES}
    names = [n.strip() for n in str(p.get("--cases", ",".join(CASES))).split(",") if n.strip()]
    for n in names:
        if n not in cases:
            raise unknown_choice("case", n, cases)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="attnbench-overhead-") as tmp:
        rows = [measure_case(n, [*cases[n], *p.overrides], int(p.get("--repeats", 3)), Path(tmp)) for n in names]
    render(rows, (load_before, os.getloadavg()))
    if p.get("--out"):
        write_atomically(Path(p.get("--out")), json.dumps(rows, indent=1))


if __name__ == "__main__":
    bare_main(sys.argv[1])
