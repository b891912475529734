# The attention zoo (conf/experiment/zoo/, bench_cli/results/report/zoo.py): every model preset
# (`attnbench ls models`: the three papers' attentions and the baselines) on every offline task
# (UEA JapaneseVowels and BasicMotions, TSER Covid3Month, generated short ListOps, ViT mnist5k),
# 3 seeds at REDUCED budgets (conf/experiment/zoo/_case/*.yaml), JOBS=2 jobs of one thread; then
# `attnbench profile` of every model against softmax at the LRA lengths 1K, 2K and 4K (the
# primal_lra_efficiency preset's LRA ListOps encoder, batch 1, one timed step after one warm-up);
# then the report results/reproduced/zoo/zoo.md with one plot per task (<task>_<dataset>.png).
# Rerunning finishes only the missing or failed jobs and rewrites the report.
# Cost, measured (results/reproduced/zoo/zoo.md): on a 2-core host about 2.5x slower per job than the
# one behind the other committed reports, 58 min in all: planning the 450 jobs 2 min 43 s, the jobs
# 48.7 min with JOBS=2 (their training times sum to 75 min: mnist5k 30, ListOps 21, Covid3Month 12,
# UEA 12), the profile 6 min 10 s, the report 10 s. The 90 minutes the zoo may take leave room.
.PHONY: zoo-data reproduce-zoo zoo-profile zoo-report

ZOO_DIR ?= results/reproduced/zoo
ZOO_PROFILE = profile=primal_lra_efficiency profile.name=zoo profile.tasks=null task=lra_listops \
	profile.models=$(shell $(BIN)/python -m bench_cli.results.report.zoo models) 'profile.seq_lens=[1024,2048,4096]' \
	profile.batch_size=1 profile.timing.repeats=1 profile.timing.eval_batches_per_1k_steps=0 \
	profile.paper=null profile.report=null profile.output=$(ZOO_DIR)/profile.csv trainer.progress=false

zoo-data: install ## The zoo's short generated ListOps (2,000/500/500 samples of 100-250 tokens under <data root>/zoo_listops; ~30 s)
	$(BIN)/attnbench data lra_listops --generate experiment=zoo/offline experiment/zoo/_case=listops

zoo-profile: install ## Profile every zoo model against softmax at the LRA lengths 1K-4K: results/reproduced/zoo/profile.csv
	$(BIN)/attnbench profile $(ZOO_PROFILE)

zoo-report: install ## Rewrite the zoo's report from its records and profile: results/reproduced/zoo/zoo.md + one plot per task
	$(BIN)/attnbench report zoo/offline --records $(ZOO_DIR)/zoo.records.csv --out $(ZOO_DIR)

reproduce-zoo: zoo-data ## The attention zoo: every attention x every offline task x 3 seeds (REDUCED budgets), the LRA-length profile, the report in results/reproduced/zoo/ (58 min on a slow 2-core host); JOBS=2
	@status=0; export ATTNBENCH_MADE_BY="$(strip make $@ $(call user_variables,JOBS LAUNCHER ZOO_DIR ARGS))"; \
	$(BIN)/attnbench sweep experiment=zoo/offline results.path=$(ZOO_DIR)/zoo.records.csv $(LAUNCHER) $(ARGS) \
	  || status=$$?; \
	$(BIN)/attnbench profile $(ZOO_PROFILE) || status=$$?; \
	$(BIN)/attnbench report zoo/offline --records $(ZOO_DIR)/zoo.records.csv --out $(ZOO_DIR) || exit $$?; exit $$status
