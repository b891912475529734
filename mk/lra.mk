# Long Range Arena (tasks/lra.py, conf/task/lra_*.yaml): data, and the LRA tables of the papers
# (conf/experiment/primal_dual/{_lra,table2,table7,table11}.yaml, primal_attention/lra.yaml): a
# resumable sweep, then the report (paper vs reproduced) in $(RECORDS)/<experiment>.{md,csv} (mk/reproduce.mk).
# The full tables need a GPU (sequences of 1K-4K, 5K-62K steps); they run unchanged there, e.g.
#   make reproduce-table2 ARGS="trainer.device=cuda"
#   make reproduce-table2 DATASETS=lra_listops,lra_retrieval      # some of the 5 tasks
# A small machine keeps the paper's effective batch with ARGS="trainer.micro_batch_size=8".
# Offline on a CPU, on the zoo's short generated ListOps: make reproduce-table2-listops-cpu,
# make reproduce-primal-lra-listops-cpu (every row of Primal-Attention Table 3) and
# make reproduce-table4-listops-cpu (head diversity, primal-dual Table 4's measure).
.PHONY: lra-data lra-data-listops reproduce-table2 reproduce-table2-listops-cpu reproduce-table7 \
	reproduce-table11 reproduce-primal-lra reproduce-primal-lra-listops-cpu reproduce-primal-supp-dd-lra \
	reproduce-table4 reproduce-table4-listops-cpu reproduce-appc

LRA_TASKS := lra_listops,lra_text,lra_retrieval,lra_image,lra_pathfinder
# DATASETS on the command line (comma-separated task names) restricts the task axis.
LRA_SELECTED = $(if $(filter command line environment,$(origin DATASETS)),$(DATASETS),$(LRA_TASKS))


lra-data: install ## LRA data: the release (ListOps, Retrieval, Pathfinder; several GB), IMDB (HF), CIFAR-10; needs a network
	$(BIN)/attnbench data lra
	$(BIN)/attnbench data lra_text imdb
	$(BIN)/attnbench data lra_image cifar10

lra-data-listops: install ## Generate LRA ListOps offline (the official generator: 96000/2000/2000, lengths 500-2000; under a minute on 2 cores)
	$(BIN)/attnbench data lra_listops --generate

reproduce-table2: install ## Primal-dual Table 2 (LRA: softmax vs BN/SH/BN+SH, 5 seeds; GPU): sweep + report; DATASETS=lra_listops,...
	$(call sweep_and_report,primal_dual/table2,,task=$(LRA_SELECTED),)

reproduce-table2-listops-cpu: zoo-data ## Primal-dual Table 2, ListOps row, REDUCED CPU budget (short generated ListOps, 400 steps at lr 1e-3, 4 models x 3 seeds; the jobs of table4-listops-cpu without its measure)
	$(call sweep_and_report,primal_dual/table2_listops_cpu,,,)

reproduce-table7: install ## Primal-dual Table 7 (LRA: softmax vs Attention-Conv1D, kernel 5; GPU): sweep + report; DATASETS=...
	$(call sweep_and_report,primal_dual/table7,,task=$(LRA_SELECTED),)

reproduce-table11: install ## Primal-dual Table 11 (LRA Retrieval: learnable vs fixed beta; GPU): sweep + report
	$(call sweep_and_report,primal_dual/table11,,,)

reproduce-primal-lra: install ## Primal-Attention Table 3 (LRA, every row: Transformer, Reformer, Performer, Linformer, Nystromformer, Longformer, YOSO-E, PrimalFormer, Primal.+; GPU): sweep + report; DATASETS=...
	$(call sweep_and_report,primal_attention/lra,,task=$(LRA_SELECTED),)

# The offline Table 3 subset (conf/experiment/primal_attention/lra_listops_cpu.yaml): every row on
# the zoo's short generated ListOps (100-250 tokens), 400 steps at lr 1e-3, 3 seeds, JOBS=2 jobs of
# one thread. The first version ran the release's lengths (2K) for 40 steps: every row at chance.
reproduce-primal-lra-listops-cpu: zoo-data ## Primal-Attention Table 3, ListOps column, every row, REDUCED CPU budget (short generated ListOps, 400 steps at lr 1e-3, 9 models x 3 seeds; 45.9 min on a slow 2-core host)
	$(call sweep_and_report,primal_attention/lra_listops_cpu,,,$(LAUNCHER))

reproduce-primal-supp-dd-lra: install ## Primal-Attention supplement Table 4 (Primal.+Trans., data-dependent vs -independent W_e, W_r on LRA; GPU): sweep + report; DATASETS=...
	$(call sweep_and_report,primal_attention/supp_table4,,task=$(LRA_SELECTED),)

reproduce-table4: install ## Primal-dual Table 4 (head diversity of LRA Retrieval models: L2 distances between heads; GPU): sweep + report
	$(call sweep_and_report,primal_dual/table4,,,)

reproduce-table4-listops-cpu: zoo-data ## Primal-dual Table 4's head-diversity measure on trained short generated ListOps models (the zoo's data), REDUCED CPU budget (400 steps at lr 1e-3, 4 models x 3 seeds; 12.4 min on a slow 2-core host)
	$(call sweep_and_report,primal_dual/table4_listops_cpu,,,$(LAUNCHER))

reproduce-appc: install ## Primal-dual Appendix C (sparse attention vs Sparse-SH/BN+SH on LRA Retrieval; GPU): sweep + report
	$(call sweep_and_report,primal_dual/appc_retrieval,,,)
