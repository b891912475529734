"""The evaluation protocols (holdout, paper) as data, without torch: the records' schema and
`attnbench ls runs` read them in processes that never train. Part of the task contract
(bench_cli/core/task.py re-exports them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Protocol:
    """How a protocol uses the splits (recorded in every result): ``selects`` is the split whose
    evaluations select the reported one; ``holds_out`` means test is evaluated apart, with the
    selected weights; ``keeps`` the rule: ``best`` (the best value of the selection metric, ties to
    the lower loss) or ``last`` (the last evaluation, whatever its value).
    - ``holdout``: a validation split carved from TRAIN selects the evaluation (the best one); the
      test metrics of those weights are reported.
    - ``paper``: what the papers' code reported, from evaluations of TEST during training: the best
      one (``paper_selection: best``, the default: DeiT's max_accuracy, the highest accuracy or
      lowest RMSE over the epochs; optimistic, the test set selects the model) or the last one
      (``paper_selection: last``: keras' fit without a checkpoint, which logs the test set as its
      validation_data; the Decision Transformer's final iteration). Reported under this name only."""

    name: str
    selects: str
    holds_out: bool
    keeps: str = "best"

    @property
    def selection(self) -> str:
        """The record's ``selection``: the rule and the split it reads ('best val', 'last test')."""
        return f"{self.keeps} {self.selects}"


PROTOCOL_SPLITS = {"holdout": Protocol("holdout", "val", True), "paper": Protocol("paper", "test", False)}
PROTOCOLS = tuple(PROTOCOL_SPLITS)
# task.paper_selection: which of the paper protocol's TEST evaluations is reported (Protocol.keeps)
PAPER_SELECTIONS = ("best", "last")
