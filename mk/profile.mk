# `attnbench profile` (bench_cli/commands/profile/): FLOPs, memory, time and parameter ratios on
# synthetic inputs, no dataset needed. Outputs under results/reproduced/ (see efficiency.md there).
.PHONY: profile bench-cli reproduce-figure1 reproduce-figures2-4 reproduce-pba-flops reproduce-primal-lra-efficiency reproduce-efficiency

# DEVICE=cuda: the GPU preset of each target (conf/profile/<preset>_gpu.yaml: the papers' batch sizes, timed on
# one GPU in the papers' regime with today's fused softmax beside it; each target under 5 minutes).
DEVICE ?= cpu
GPU_PRESET = $(if $(filter cuda,$(DEVICE)),_gpu)

# The pay-better-attention transcription is cross-checked against the reference CSV when present.
PBA_REFERENCE ?= $(firstword $(wildcard results/paper/pay_better_attention.csv ../shared/reference/pay_better_attention.csv))

profile: install ## Profile model vs baseline on synthetic inputs; ARGS="model=... baseline=... task=... profile.seq_lens=[...]"
	$(BIN)/attnbench profile $(ARGS)

bench-cli: install ## Time --help, ls, ls models|tasks|..., a misspelt override and validate next to `python -c "import torch"`; ARGS="--repeat N"
	$(BIN)/attnbench bench-cli $(ARGS)

reproduce-figure1: install ## Primal-dual Figure 1 (BN+SH vs softmax, LRA retrieval): results/reproduced/figure1.{csv,png} (~6 min on 2 CPU cores)
	$(BIN)/attnbench profile profile=figure1$(GPU_PRESET) $(ARGS)

reproduce-figures2-4: install ## Primal-dual Figures 2-4 (SH; sparse BN+SH; sparse SH vs their baselines): results/reproduced/figure{2,3,4}.{csv,png}
	$(BIN)/attnbench profile profile=figure2$(GPU_PRESET) $(ARGS)
	$(BIN)/attnbench profile profile=figure3$(GPU_PRESET) $(ARGS)
	$(BIN)/attnbench profile profile=figure4$(GPU_PRESET) $(ARGS)

reproduce-pba-flops: install ## Pay-better-attention Eqn. (24), Figures 2-4 and the '# Param.' columns of Tables 1-10: results/reproduced/pba_*
	$(BIN)/attnbench profile profile=pba $(if $(filter cuda,$(DEVICE)),trainer.device=cuda) $(if $(PBA_REFERENCE),profile.reference_csv=$(PBA_REFERENCE)) $(ARGS)

reproduce-primal-lra-efficiency: install ## Primal-Attention Table 4 (LRA time per 1K steps, peak memory; ratios to the Transformer beside the paper's; ~10 min; DEVICE=cuda: the paper's batches on a GPU, < 5 min): lra_efficiency.{csv,md} in results/reproduced/primal_attention
	$(BIN)/attnbench profile profile=primal_lra_efficiency$(GPU_PRESET) $(ARGS)

reproduce-efficiency: reproduce-figure1 reproduce-figures2-4 reproduce-pba-flops reproduce-primal-lra-efficiency ## All of the above (the runs behind results/reproduced/efficiency.md)

.PHONY: bench-overhead
bench-overhead: install ## `attnbench run` vs a bare PyTorch loop of the same config, side by side (UEA, LRA ListOps, ViT; ~5 min idle); ARGS="--repeats 3"
	$(BIN)/attnbench bench-overhead $(ARGS)
