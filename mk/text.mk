# Text tasks of papers/002 (tasks/text/, conf/task/{textcls,nmt}.yaml): the data, then each table
# (conf/experiment/pay_better_attention/{table2,table3,table4_text,table8,table9,table10}.yaml) as a
# resumable sweep and its report (paper vs reproduced) in $(RECORDS)/pay_better_attention/.
# Uses reproduce.mk's sweep_and_report (DATASETS, JOBS, LAUNCHER, ARGS work as there).
#
#   make text-data                                          # needs a network (HF hub, fast.ai mirror, TF storage)
#   make reproduce-pba-table8                               # IMDB: feasible on a CPU (60 short runs)
#   make reproduce-pba-table2 DATASETS=imdb                 # Table 2 without Amazon
#   make reproduce-pba-table3 LAUNCHER= ARGS="trainer.device=cuda"   # translation: a GPU
#
# Amazon (3M reviews) and the translation tables (2M pairs, d_model 1024) need a GPU at full size.
# TEXT_STEPS cuts every job to a budget of optimiser steps (trainer.step_budget); empty = the full
# schedules (conf/task/{textcls,nmt}.yaml: train.epochs).
.PHONY: text-data reproduce-pba-table2 reproduce-pba-table3 reproduce-pba-table4-text reproduce-pba-table8 \
	reproduce-pba-table9 reproduce-pba-table10

TEXT_STEPS ?=

text-data: install ## Pay-better-attention text data: IMDB and Europarl (HF), Amazon Review Full (~640 MB), Anki spa-eng; needs a network
	$(BIN)/attnbench data textcls imdb
	$(BIN)/attnbench data textcls amazon
	$(BIN)/attnbench data nmt europarl_anki

reproduce-pba-table2: install ## Pay-better-attention Table 2 (IMDB, Amazon; 4 attentions, h=4, 5 seeds): sweep + report; DATASETS=imdb on a CPU
	$(call sweep_and_report,pay_better_attention/table2,TEXT_STEPS,,$(LAUNCHER))

reproduce-pba-table8: install ## Pay-better-attention Table 8 (IMDB, h=1/2/4): sweep + report
	$(call sweep_and_report,pay_better_attention/table8,TEXT_STEPS,,$(LAUNCHER))

reproduce-pba-table9: install ## Pay-better-attention Table 9 (Amazon, h=1/2/4; GPU): sweep + report
	$(call sweep_and_report,pay_better_attention/table9,TEXT_STEPS,,$(LAUNCHER))

reproduce-pba-table4-text: install ## Pay-better-attention Table 4, IMDB and Amazon columns (inference time of 5,000 samples, h=1/4/8): sweep + report
	$(call sweep_and_report,pay_better_attention/table4_text,TEXT_STEPS,,$(LAUNCHER))

reproduce-pba-table3: install ## Pay-better-attention Table 3 (English-Spanish, Europarl+Anki, h=4; GPU): sweep + report
	$(call sweep_and_report,pay_better_attention/table3,TEXT_STEPS,,$(LAUNCHER))

reproduce-pba-table10: install ## Pay-better-attention Table 10 (English-Spanish, h=1/2/4; GPU): sweep + report
	$(call sweep_and_report,pay_better_attention/table10,TEXT_STEPS,,$(LAUNCHER))
