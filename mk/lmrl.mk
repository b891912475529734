# Language modelling (task=lm, conf/task/lm.yaml) and offline RL (task=d4rl, conf/task/d4rl.yaml):
# data, and the Primal-Attention tables (conf/experiment/primal_attention/{wikitext103,d4rl,d4rl_s}.yaml):
# a resumable sweep, then the report in $(RECORDS)/primal_attention/<table>.{md,csv} (mk/reproduce.mk).
# The full schedules need a GPU (WikiText-103: 150,000 updates of 64 x 512 tokens; D4RL: 100,000
# steps per run, 189 runs in Table 5: 7 models x 9 sets x 3 seeds) and the data; they run unchanged there, e.g.
#   make reproduce-primal-d4rl ARGS="trainer.device=cuda"
#   make reproduce-primal-d4rl D4RL_SETS=hopper-medium-v2,walker2d-medium-v2
.PHONY: wikitext-data d4rl-data reproduce-primal-wikitext103 reproduce-primal-d4rl reproduce-primal-d4rl-s

D4RL_ALL := halfcheetah-medium-expert-v2 hopper-medium-expert-v2 walker2d-medium-expert-v2 \
	halfcheetah-medium-v2 hopper-medium-v2 walker2d-medium-v2 \
	halfcheetah-medium-replay-v2 hopper-medium-replay-v2 walker2d-medium-replay-v2
# D4RL_SETS on the command line (comma-separated) restricts the dataset axis.
D4RL_SETS ?=
D4RL_AXIS = $(if $(D4RL_SETS),task.dataset=$(D4RL_SETS))


wikitext-data: install ## WikiText-103 v1 (wiki.*.tokens, 190 MB zip; or HF Salesforce/wikitext); needs a network
	$(BIN)/attnbench data wikitext wikitext103

d4rl-data: install ## The nine D4RL v2 gym-mujoco HDF5 files of Primal-Attention Table 5 (~1.5 GB); needs a network
	@for d in $(D4RL_ALL); do $(BIN)/attnbench data d4rl $$d || exit $$?; done

reproduce-primal-wikitext103: install ## Primal-Attention Table 7(b) (WikiText-103: Transformer, Flowformer, Primal.+; GPU): sweep + report
	$(call sweep_and_report,primal_attention/wikitext103,,,)

reproduce-primal-d4rl: install ## Primal-Attention Table 5 (D4RL, every row: DT, causal Linear, Reformer, Performer, cosFormer, Flowformer, Primal.+DT; 9 sets x 3 seeds; GPU): sweep + report; D4RL_SETS=...
	$(call sweep_and_report,primal_attention/d4rl,,$(D4RL_AXIS),)

reproduce-primal-d4rl-s: install ## Primal-Attention supplement Table 2 (Primal.+DT, s = 32/64/96; GPU): sweep + report; D4RL_SETS=...
	$(call sweep_and_report,primal_attention/d4rl_s,,$(D4RL_AXIS),)
