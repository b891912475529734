# Reproductions of the papers' tables: a resumable sweep, then the report written to
# $(RECORDS)/<experiment>.{md,csv}. By default every job runs afresh into your own untracked records
# (RECORDS=results/local), and the report shows per cell the paper, the committed reproduction
# (results/reproduced/<experiment>.records.csv) and your run, with Welch's test against each.
# Rerunning a target finishes only the jobs that are missing or failed; the report is rewritten from
# all records. Maintainers update the committed reproduction with RECORDS=results/reproduced.
#
#   make reproduce-table1 DATASETS=JapaneseVowels,BasicMotions    # the sets available offline
#   make reproduce-primal-uea DATASETS=JapaneseVowels,BasicMotions
#   make reproduce-table1 STEPS= JOBS=8                           # the codebases' own epochs
#
# DATASETS  restricts the dataset axis (comma-separated UEA names); empty = the table's sets.
# STEPS     a CPU budget in optimiser steps (trainer.step_budget): each job runs the epochs of the
#           code the paper followed (400 Zerveas / 100 Flowformer / 100 Primal-Attention; 400 on
#           PEMS-SF), cut to at most ceil(STEPS / steps per epoch) whole epochs, so big datasets are
#           cut more than small ones. Empty = the full schedules. STEPS=300 (chosen so that the
#           offline subset of Table 1 takes about 20 min on 2 cores) is 60 of 400 epochs on
#           JapaneseVowels (5 steps/epoch at batch 64) and 300 of 400 on BasicMotions (1 step/epoch);
#           PRIMAL_STEPS=170 is JapaneseVowels 10 of 100 epochs at batch 16 and BasicMotions 57 of
#           100. The report header states the epochs that were run per dataset. The Primal-Attention
#           table has 11 rows (the Transformer, 8 baselines, PrimalFormer, Primal.+): the offline subset
#           is 110 jobs. Measured on a slow 2-core host (JOBS=2, results/reproduced/one_host/):
#           JapaneseVowels, every row x 5 seeds, 45.2 min; BasicMotions, every row x 3 seeds
#           (ARGS=seed=0,1,2), 90.5 min: 3.5-7 min per job (57 epochs at length 100), SOFT 10-13 min
#           (every token a landmark: 2.4x the Transformer's epoch time, 3x its memory), so all 5 seeds
#           of both sets take about 3.3 h. A rerun runs only the jobs without an ok record.
# JOBS      parallel jobs (joblib launcher, 1 torch thread each on 2 cores).
# LAUNCHER  the launcher overrides, e.g. LAUNCHER="hydra/launcher=slurm hydra.launcher.partition=gpu".
# ARGS      extra overrides for the sweep, e.g. ARGS="trainer.device=cuda".
# RECORDS   where the per-run records (<experiment>.records.csv) and the reports (<experiment>.md/.csv)
#           go: results/local (untracked) by default; results/reproduced is the committed
#           reproduction (every seed can be audited), rewritten only when asked for.
.PHONY: reproduce-table1 reproduce-table5 reproduce-table9 reproduce-table10 reproduce-primal-uea reproduce-uea \
	reproduce-primal-supp-eta-s reproduce-primal-supp-dd-uea

DATASETS ?=
STEPS ?= 300
PRIMAL_STEPS ?= 170
JOBS ?= 2
LAUNCHER ?= hydra/launcher=joblib_cpu hydra.launcher.n_jobs=$(JOBS)
ARGS ?=
RECORDS ?= results/local
COMMITTED := results/reproduced

# The variables of $(1) that the command line or the environment set, as VAR=value (quoted when the
# value holds a space): a report's "made by" line names them all (ARGS: overrides of every job), so
# that the line run as printed reruns the same jobs into the same records.
space := $(subst ,, )
user_variables = $(foreach v,$(1),$(if $(filter command line environment,$(origin $(v))),$(v)=$(if $(findstring $(space),$($(v))),'$($(v))',$($(v)))))

# `--committed <its records>` for the report of experiment $(1), unless RECORDS is the committed folder.
committed_option = $(if $(filter-out $(COMMITTED),$(patsubst %/,%,$(RECORDS))),$(if $(wildcard $(COMMITTED)/$(1).records.csv),--committed $(COMMITTED)/$(1).records.csv))

# The one sweep-then-report recipe of every family's make targets (mk/*.mk):
#   $(call sweep_and_report,EXPERIMENT,BUDGET_VARIABLE,AXIS_OVERRIDES,LAUNCHER_OVERRIDES)
# BUDGET_VARIABLE names the make variable holding a step budget (empty: none); AXIS_OVERRIDES
# restricts the grid (default: task.dataset=$(DATASETS) when DATASETS is set). The per-run records
# go to $(RECORDS)/<experiment>.records.csv and the report beside them, compared with the committed
# reproduction's records when RECORDS is not results/reproduced itself. The sweep's exit status
# (number of failed jobs) is the target's, after the report has been written with whatever finished.
define sweep_and_report
	@status=0; export ATTNBENCH_MADE_BY="$(strip make $@ $(call user_variables,DATASETS) $(if $(2),$(2)=$($(2))) \
	  $(call user_variables,JOBS LAUNCHER RECORDS ARGS))"; \
	$(BIN)/attnbench sweep experiment=$(1) $(or $(3),$(if $(DATASETS),task.dataset=$(DATASETS))) \
	  $(if $(2),$(if $($(2)),trainer.step_budget=$($(2)))) results.path=$(RECORDS)/$(1).records.csv $(4) $(ARGS) \
	  || status=$$?; \
	$(BIN)/attnbench report $(1) --records $(RECORDS)/$(1).records.csv --out $(RECORDS) \
	  $(call committed_option,$(1)) \
	  || exit $$?; exit $$status
endef

reproduce-table1: install ## Primal-dual Table 1 (Table 9 numbers for its sets): sweep 4 models x 5 seeds + report; DATASETS=JapaneseVowels,BasicMotions STEPS=300 JOBS=2
	$(call sweep_and_report,primal_dual/table1,STEPS,,$(LAUNCHER))

reproduce-table9: install ## Primal-dual Table 9 (15 more UEA sets; download them first): sweep + report
	$(call sweep_and_report,primal_dual/table9,STEPS,,$(LAUNCHER))

reproduce-table5: install ## Primal-dual Table 5 (linear attention + BN/SH): sweep + report
	$(call sweep_and_report,primal_dual/table5,STEPS,,$(LAUNCHER))

reproduce-table10: install ## Primal-dual Table 10 (sparse attention + BN/SH): sweep + report
	$(call sweep_and_report,primal_dual/table10,STEPS,,$(LAUNCHER))

reproduce-primal-uea: install ## Primal-Attention Table 1 (UEA, every row: Transformer, 8 efficient baselines, PrimalFormer, Primal.+Trans.): sweep + report; offline DATASETS=JapaneseVowels,BasicMotions PRIMAL_STEPS=170 (on a slow 2-core host: JapaneseVowels x 5 seeds 45 min, BasicMotions x 3 seeds 91 min)
	$(call sweep_and_report,primal_attention/uea,PRIMAL_STEPS,,$(LAUNCHER))

reproduce-primal-supp-eta-s: install ## Primal-Attention supplement Table 1 (PrimalFormer, s x eta grid on UEA): sweep + report; DATASETS=... PRIMAL_STEPS=170
	$(call sweep_and_report,primal_attention/supp_table1,PRIMAL_STEPS,,$(LAUNCHER))

reproduce-primal-supp-dd-uea: install ## Primal-Attention supplement Table 3 (Primal.+Trans., data-dependent vs -independent W_e, W_r on UEA): sweep + report; DATASETS=... PRIMAL_STEPS=170
	$(call sweep_and_report,primal_attention/supp_table3,PRIMAL_STEPS,,$(LAUNCHER))

reproduce-uea: reproduce-table1 reproduce-primal-uea ## Both UEA reproductions committed in results/reproduced/

# Time-series extrinsic regression (primal-dual Table 8). The six sets need `attnbench data tser NAME`;
# offline, the two sets sktime ships: make reproduce-table8 DATASETS=Covid3Month,Tecator.
# TSER_STEPS: a CPU budget in optimiser steps per job, as STEPS above. 60 is 20 of the 100 epochs on
# both offline sets (3 steps per epoch at batch 64): the 40 jobs took 8 min 08 s on 2 cores, and the
# RMSEs are not converged (the report header states the epochs). TSER_STEPS= runs the full
# schedule: 32 min on 2 cores, committed in results/reproduced/full_schedule/primal_dual/table8.*.
TSER_STEPS ?= 60
.PHONY: reproduce-table8
reproduce-table8: install ## Primal-dual Table 8 (TSER regression, RMSE; lower is better): sweep + report; offline DATASETS=Covid3Month,Tecator
	$(call sweep_and_report,primal_dual/table8,TSER_STEPS,,$(LAUNCHER))
