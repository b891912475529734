# Image classification (tasks/vision, conf/task/{vit,deit}.yaml): data, and the vision tables of the
# papers (conf/experiment/pay_better_attention/table{1,4_vision,5,6,7}.yaml, primal_dual/table{3,6}.yaml,
# primal_attention/imagenet.yaml): a resumable sweep, then the report in $(RECORDS)/ (mk/reproduce.mk).
# MNIST and CIFAR-100 download with `make vision-data`; ImageNet goes by hand under the data root
# as imagenet/{train,val}/<wnid>/*.JPEG (ImageNet-100 is read from it). Everything but the mnist5k
# target needs GPUs; multi-GPU jobs on Slurm: VISION_LAUNCHER="hydra/launcher=slurm_ddp ..." with
# ARGS="trainer.strategy=ddp" (one run on one node: torchrun, see docs/gpu.md).
#   make reproduce-pba-mnist5k                       # offline, 2 CPU cores, 10 min
#   make reproduce-pba-table1 ARGS="trainer.num_workers=8"
#   make reproduce-table3 VISION_LAUNCHER="hydra/launcher=slurm_ddp hydra.launcher.partition=gpu" ARGS="trainer.strategy=ddp"
.PHONY: vision-data reproduce-pba-mnist5k reproduce-pba-table1 reproduce-pba-table4 reproduce-pba-table5 \
	reproduce-pba-table6 reproduce-pba-table7 reproduce-table3 reproduce-table6 reproduce-primal-deit \
	reproduce-vision

# GPU sweeps run one job at a time unless LAUNCHER says otherwise (the UEA default is joblib on 2 CPU cores).
VISION_LAUNCHER ?=


vision-data: install ## MNIST and CIFAR-100 (torchvision downloads; needs a network); ImageNet goes by hand (see `attnbench ls datasets`)
	$(BIN)/attnbench data vision mnist
	$(BIN)/attnbench data vision cifar100

reproduce-pba-mnist5k: install ## Pay-better-attention Table 5 (h=4) on mnist5k (5,000 real digits, offline), REDUCED budget: 4 models x 5 seeds, 2 CPU jobs (10 min)
	$(call sweep_and_report,pay_better_attention/table5_mnist5k_cpu,,,$(LAUNCHER))

# The paper averages five runs except on ImageNet (one run): MNIST and CIFAR-100 over the grid's
# seeds, then ImageNet with seed 0, into one records file; then the report. $(1): the experiment.
define sweeps_imagenet_once
	@status=0; export ATTNBENCH_MADE_BY="$(strip make $@ $(call user_variables,VISION_LAUNCHER RECORDS ARGS))"; \
	records=$(RECORDS)/$(1).records.csv; \
	$(BIN)/attnbench sweep experiment=$(1) task.dataset=mnist,cifar100 results.path=$$records $(VISION_LAUNCHER) $(ARGS) || status=$$?; \
	$(BIN)/attnbench sweep experiment=$(1) task.dataset=imagenet seed=0 results.path=$$records $(VISION_LAUNCHER) $(ARGS) || status=$$?; \
	$(BIN)/attnbench report $(1) --records $$records --out $(RECORDS) $(call committed_option,$(1)) || exit $$?; exit $$status
endef

reproduce-pba-table1: install ## Pay-better-attention Table 1 (MNIST, CIFAR-100 x 5 seeds; ImageNet x 1): sweeps + report (GPUs)
	$(call sweeps_imagenet_once,pay_better_attention/table1)

reproduce-pba-table4: install ## Pay-better-attention Table 4, vision columns (inference time, h=1/4/8; MNIST, CIFAR-100 x 5 seeds, ImageNet x 1): sweeps + report
	$(call sweeps_imagenet_once,pay_better_attention/table4_vision)

reproduce-pba-table5: install ## Pay-better-attention Table 5 (MNIST, h=1/2/4, 5 seeds): sweep + report (GPU)
	$(call sweep_and_report,pay_better_attention/table5,,,$(VISION_LAUNCHER))

reproduce-pba-table6: install ## Pay-better-attention Table 6 (CIFAR-100, h=1/2/4/8, 5 seeds): sweep + report (GPU)
	$(call sweep_and_report,pay_better_attention/table6,,,$(VISION_LAUNCHER))

reproduce-pba-table7: install ## Pay-better-attention Table 7 (ImageNet ViTs of ~60M parameters): sweep + report (GPUs)
	$(call sweep_and_report,pay_better_attention/table7,,,$(VISION_LAUNCHER))

reproduce-table3: install ## Primal-dual Table 3 (DeiT-tiny, 4 heads, ImageNet: softmax vs BN/SH/BN+SH): sweep + report (GPUs)
	$(call sweep_and_report,primal_dual/table3,,,$(VISION_LAUNCHER))

reproduce-table6: install ## Primal-dual Table 6 (DeiT-tiny, ImageNet: softmax vs Attention-Conv2D): sweep + report (GPUs)
	$(call sweep_and_report,primal_dual/table6,,,$(VISION_LAUNCHER))

reproduce-primal-deit: install ## Primal-Attention ImageNet table (DeiT-Small/16 vs Primal.+, ImageNet-100 and -1K): sweep + report (GPUs)
	$(call sweep_and_report,primal_attention/imagenet,,,$(VISION_LAUNCHER))

reproduce-vision: reproduce-pba-table1 reproduce-pba-table4 reproduce-pba-table5 reproduce-pba-table6 reproduce-pba-table7 \
	reproduce-table3 reproduce-table6 reproduce-primal-deit ## Every vision table above (GPUs, datasets)
