# GPU smoke check: docs/gpu.md "GPU machine".
.PHONY: smoke-gpu

smoke-gpu: install ## Every family briefly on every visible GPU, fp32 and autocast, DDP, CUDA timing: results/smoke/; no GPU: one line, exit 2
	$(BIN)/attnbench smoke $(ARGS)
