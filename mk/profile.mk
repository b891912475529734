# `attnbench profile` (bench_cli/profile/): FLOPs, memory, time and parameter ratios on
# synthetic inputs, no dataset needed. Outputs under results/reproduced/ (see efficiency.md there).
.PHONY: profile reproduce-figure1 reproduce-figures2-4 reproduce-pba-flops reproduce-efficiency

# The pay-better-attention transcription is cross-checked against the reference CSV when present.
PBA_REFERENCE ?= $(firstword $(wildcard results/paper/pay_better_attention.csv ../shared/reference/pay_better_attention.csv))

profile: install ## Profile model vs baseline on synthetic inputs; ARGS="model=... baseline=... task=... profile.seq_lens=[...]"
	$(BIN)/attnbench profile $(ARGS)

reproduce-figure1: install ## Primal-dual Figure 1 (BN+SH vs softmax, LRA retrieval): results/reproduced/figure1.{csv,png} (~6 min on 2 CPU cores)
	$(BIN)/attnbench profile profile=figure1 $(ARGS)

reproduce-figures2-4: install ## Primal-dual Figures 2-4 (SH; sparse BN+SH; sparse SH vs their baselines): results/reproduced/figure{2,3,4}.{csv,png}
	$(BIN)/attnbench profile profile=figure2 $(ARGS)
	$(BIN)/attnbench profile profile=figure3 $(ARGS)
	$(BIN)/attnbench profile profile=figure4 $(ARGS)

reproduce-pba-flops: install ## Pay-better-attention Eqn. (24), Figures 2-4 and the '# Param.' columns of Tables 1-10: results/reproduced/pba_*
	$(BIN)/attnbench profile profile=pba $(if $(PBA_REFERENCE),profile.reference_csv=$(PBA_REFERENCE)) $(ARGS)

reproduce-efficiency: reproduce-figure1 reproduce-figures2-4 reproduce-pba-flops ## All of the above (the runs behind results/reproduced/efficiency.md)
