"""A run's measurement (``measure_run``): the counted parameters, FLOPs and peak memory of its model
(bench_cli.engine.counting) with their cache across the jobs of a sweep (``MeasureCache``), its
inference time (bench_cli.engine.timing's timer) and the heads' diversity.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from bench_cli.core.errors import warn_once
from bench_cli.core.files import write_atomically
from bench_cli.core.spread import Spread
from bench_cli.engine.counting import ValueReads, count_parameters, measure_model, process_peak_rss_bytes
from bench_cli.engine.timing import seconds

__all__ = ["MeasureCache", "example_batch", "inference_time", "measure_run"]


def example_batch(task, split: str, batch_size: int, device) -> dict:
    """The first ``batch_size`` samples of ``split`` as one batch (the task's collate)."""
    from torch.utils.data import DataLoader

    from bench_cli.core.task import to_device

    loader = DataLoader(task.dataset(split), batch_size=batch_size, shuffle=False, collate_fn=task.collate(split))
    return to_device(next(iter(loader)), device)


def measure_run(task, model, cfg, device, objective) -> dict:
    """A run's measurement columns: parameters, FLOPs per sample and peak memory of one training
    step of the run's objective (the KSVD term included) and of one inference batch, by the one
    measurement path (measure_model) as `attnbench profile` measures; the inference time
    (``measure.inference_samples``) and the heads' diversity (``measure.head_diversity``)."""
    from bench_cli.engine.head_diversity import record_head_diversity
    from bench_cli.results.schema import measurement_columns

    started = time.perf_counter()
    # one forward/backward of training: a micro-batch when the batch is accumulated (a 64 x 512-token
    # batch of the 267,744-word LM would need 35 GB of logits; training never holds it at once)
    size = min(int(cfg.trainer.batch_size), int(cfg.trainer.get("micro_batch_size") or cfg.trainer.batch_size))
    batch = example_batch(task, "train", size, device)
    flops = ("meta" if cfg.measure.get("meta_flops", False) else "real") if cfg.measure.flops else "off"
    memory = "real" if cfg.measure.memory else "off"
    cache = MeasureCache.of(cfg, model, task, batch, device, (flops, memory))
    measured = cache.load(count_parameters(model)) if cache else None
    if measured is None:
        with ValueReads() as reads:
            measured = measure_model(model, task.model_inputs(batch), objective.on(model, batch),
                                     task.batch_len(batch), flops=flops, memory=memory)
        if cache and not reads.seen:  # shapes alone decided the ops: the next job of these shapes reuses it
            cache.store(measured)
    out = {k: v for k, v in measured.items() if k not in ("flops_method", "memory_method")}
    samples = int(cfg.measure.get("inference_samples") or 0)
    if samples:
        out.update(inference_time(task, model, cfg, device, samples))
    out["peak_rss_bytes"] = process_peak_rss_bytes()
    out["measure_time_s"] = round(time.perf_counter() - started, 3)
    return measurement_columns(out) | record_head_diversity(cfg, task, model, device)


class MeasureCache:
    """Parameters, FLOPs and peak memory of a (model, task shape), measured by one job and reused by
    the next jobs of a sweep that have the same key (other seeds, above all): the semantic model
    and task config, the example batch (its shapes, dtypes and values), the measurement modes, the
    device type, torch's version and the source of every module the model is made of, of the task
    and of the measurement. Only measurements that read no tensor value are stored
    (ValueReads): they depend on the shapes, not on the weights. One JSON file
    per key in ``.measure_cache/`` beside ``results.path``, written atomically (parallel jobs);
    ``measure.cache=false`` turns it off."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, cfg, model, task, batch: dict, device, modes: tuple) -> MeasureCache | None:
        import hashlib
        import inspect

        from omegaconf import OmegaConf

        if not cfg.measure.get("cache", True) or modes == ("off", "off"):
            return None
        import attnbench.models as models

        # the model zoo's code (helpers included), a plugin's modules, the task's, the measurement's
        sources = set(Path(models.__file__).parent.rglob("*.py"))
        sources |= {inspect.getsourcefile(cls) for m in model.modules() for cls in type(m).__mro__
                    if not cls.__module__.startswith(("torch", "builtins"))}
        sources |= {inspect.getsourcefile(type(task)), Path(__file__), Path(__file__).with_name("counting.py"),
                    Path(__file__).with_name("objective.py")}
        digest = hashlib.sha256()
        for part in (OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.task, resolve=True),
                     modes, device.type, torch.__version__):
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        for name in sorted(batch):
            value = batch[name]
            if torch.is_tensor(value):
                digest.update(f"{name}{tuple(value.shape)}{value.dtype}".encode())
                digest.update(value.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                digest.update(f"{name}{value!r}".encode())
        for source in sorted({Path(s) for s in sources if s}):
            digest.update(source.read_bytes())
        return cls(Path(cfg.results.path).parent / ".measure_cache" / f"{digest.hexdigest()[:32]}.json")

    def load(self, params: int) -> dict | None:
        """The entry, if it is one: a dict of numbers and strings measured on a model of ``params``
        parameters; anything else is a miss (measured again, with a warning)."""
        try:
            entry = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and entry.get("params") == params and all(
                v is None or (isinstance(v, (int, float, str)) and not isinstance(v, bool)) for v in entry.values()):
            return entry
        warn_once(f"warning: measurement cache {self.path} is not an entry for this model: measured again")
        return None

    def store(self, measured: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(measured))
        except OSError:  # a read-only results folder: measured again next time
            pass


def inference_time(task, model, cfg, device, samples: int) -> dict:
    """Inference (eval mode, no gradients, ``trainer.precision``) over the first ``samples`` test
    samples in batches of ``eval_batch_size``, after one warm-up batch; data loading excluded.
    Pay-better-attention Table 4 reports the total over 5,000 samples (on an Apple M2):
    ``infer_time_s`` is that total (scaled to ``samples`` when the test split is smaller),
    ``infer_time_per_batch_s`` the median batch, with its quartiles. Ratios between attentions are
    what compares. Not time_rounds: each batch is new data, timed once."""
    from torch.utils.data import DataLoader

    from bench_cli.core.task import to_device
    from bench_cli.engine.env import autocast

    loader = DataLoader(task.dataset("test"), batch_size=int(cfg.trainer.eval_batch_size), shuffle=False,
                        collate_fn=task.collate("test"))
    was_training = model.training
    model.eval()
    times, seen, warm = [], 0, False
    try:
        with torch.no_grad(), autocast(device, str(cfg.trainer.get("precision", "32"))):
            for batch in loader:
                keep = min(task.batch_len(batch), samples - seen)
                batch = {k: v[:keep] for k, v in batch.items()}  # the last batch holds only what is missing
                inputs = task.model_inputs(to_device(batch, device))
                if not warm:
                    model(**inputs)
                    warm = True
                times.append(seconds(lambda inputs=inputs: model(**inputs), device))
                seen += task.batch_len(batch)
                if seen >= samples:
                    break
    finally:
        model.train(was_training)
    if not times:
        return {}
    return {"infer_time_s": round(sum(times) * samples / seen, 6), "infer_samples": seen,
            "infer_batch_size": int(cfg.trainer.eval_batch_size),
            **Spread.of(times).columns("infer_time_per_batch_s")}
