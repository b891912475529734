"""Reproduction checks: what attnbench measures or counts, next to the numbers the papers print.

* :mod:`bench_cli.commands.reproduce.reductions`: the papers' quoted efficiency reductions (FLOPs, memory)
  placed next to the reductions `attnbench profile` measures at the same point (``profile.reference``
  of a preset, e.g. conf/profile/figure1.yaml).
* :mod:`bench_cli.commands.reproduce.pba`: "You Need to Pay Better Attention" (papers/002): its "# Param."
  columns counted from the built layers, and counted FLOPs next to its Eqn. (24)
  (`attnbench profile profile=pba`).

The generic measurement stays in :mod:`bench_cli.commands.profile` and :mod:`bench_cli.engine.counting`;
:mod:`bench_cli.results.report` compares run records with the papers' accuracy tables.
"""
