"""Defaults that more than one part reads: the run's configuration (``RunConfig``), the
controller's (``ControllerConfig``) and the workers' role options each took their own copy
once, and the copies drifted (steps 200 vs 20, worker_timeout_s 60 vs 30). One place each now.
Light on purpose: the controller, the workers and the engines all import it."""

STEPS = 200  # optimizer steps a run makes
MAX_STALENESS = 0  # policy versions a sample may lag the trainer
HEARTBEAT_S = 1.0
WORKER_TIMEOUT_S = 60.0  # seconds of silence before a worker is declared dead
MAX_JOBS_PER_FRAME = 32
MAX_WORKER_RESTARTS = 50
PARTIAL_ROLLOUT = False
# a worker keeps the roles it leaves loaded and takes one back without loading it again
# (memory for every role it held: on by choice; see pivotflow/worker/host.py)
WARM_ROLES = False
OVER_SAMPLE = 0.0
MAX_BATCH = 64  # sequences a generate worker decodes side by side (its slots)
KL_ESTIMATORS = ("k1", "k3")  # Schulman's KL estimators (rl/losses.kl_penalty; graph.train)
LR_SCHEDULES = ("constant", "cosine", "linear")  # after the warm-up (worker/train_config.lr_at)
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")  # the losses'
# the policy loss's importance ratio: PPO's per token, or GSPO's per sequence (rl/losses.py)
RATIO_LEVELS = ("token", "sequence")
# The linear layers LoRA may adapt, by their Hugging Face names (worker/lora.py; PEFT's
# "all-linear" for the decoder bodies pivotflow runs: never the output head or embeddings)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# DeepSeek's latent attention projections: LoRA adapts them when lora_target_modules names
# them (not by default: every other family's PEFT export would name modules it has not)
LORA_LATENT_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
# Qwen3.5's gated DeltaNet projections and Granite 4.0-H's Mamba2 ones (in_proj, out_proj;
# PEFT's "all-linear" names them too): likewise when named
LORA_LINEAR_ATTENTION_TARGETS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                 "out_proj", "in_proj")
THREADS_PER_WORKER = 1  # torch threads in each worker process
RESULTS_PER_FRAME = 0  # a worker's results per JobsDone frame (0: every one a step finished)
ENGINE = "torch"  # the engine a generate worker runs
# the engines a pool may run (pivotflow.engines.make_engine; echo: no model, for the benches)
ENGINE_KINDS = ("torch", "vllm", "sglang", "echo")
DTYPE = "auto"  # the dtype the model's config.json names
DEVICE = "cpu"
