"""Every field of the experiment schema does something: each case below runs the real `kiln`
binary twice, with and without one setting changed, and asserts that what the run shows (losses,
learning rates, loss scales, parameter count, files, messages, exit code) differs. A field whose
effect cannot show in a short CPU run names the test that shows it. The schema is read from
`kiln config --json`, so a new field without a case here fails this test.

usage: python3 settings_act.py KILN SOURCE_DIR WORK_DIR
"""
import hashlib
import json
import os
import re
import subprocess
import sys

KILN, SRC, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
TINY = os.path.join(SRC, "tests/train/tiny.pbtxt")
FASHION = "/usr/share/datasets/fashion-mnist"
BASE = ["train.steps=4", "train.log_every=1", "checkpoint.every_steps=0", "logging.tensorboard=false"]
BERT = ["model.name=bert_base", "model.bert.vocab_size=64", "model.bert.seq_len=8",
        "model.bert.hidden_size=16", "model.bert.num_layers=1", "model.bert.num_heads=2",
        "model.bert.intermediate_size=32", "model.dropout=0.1", "data.kind=SYNTHETIC"]
GPT = ["model.name=gpt2", "model.gpt.vocab_size=64", "model.gpt.seq_len=8",
       "model.gpt.hidden_size=16", "model.gpt.num_layers=1", "model.gpt.num_heads=2",
       "model.gpt.intermediate_size=32", "model.gpt.max_positions=16", "data.kind=SYNTHETIC"]
# A tiny GPT-2 on llm.c token shards (written by write_llmc_shards below).
SHARDS = ["model.name=gpt2", "model.gpt.vocab_size=64", "model.gpt.seq_len=8", "model.gpt.max_positions=8",
          "model.gpt.hidden_size=16", "model.gpt.num_layers=1", "model.gpt.num_heads=2",
          "model.gpt.intermediate_size=32", "data.kind=LLMC_SHARDS", "data.path=@SHARDS/tiny_train_*.bin",
          "data.workers=0", "data.eval_split=test", "train.eval_batches=1"]
# A tiny Llama on the same shards (tokens below 64), windows of 32.
LLAMA_SHARDS = ["model.name=llama", "model.llama.vocab_size=64", "model.llama.seq_len=32",
                "model.llama.max_positions=32", "model.llama.hidden_size=16", "model.llama.num_layers=1",
                "model.llama.num_heads=2", "model.llama.num_kv_heads=1", "model.llama.intermediate_size=32",
                "data.kind=LLMC_SHARDS", "data.path=@SHARDS/tiny_train_*.bin", "data.workers=0",
                "data.eval_split=none"]
# A 6-layer GPT whose step exceeds RECOMPUTE_CAP MiB of host memory unless its blocks recompute
# (tests/train/test_recompute.sh runs the same model).
RECOMPUTE = ["model.name=gpt2", "model.gpt.vocab_size=64", "model.gpt.seq_len=64",
             "model.gpt.hidden_size=32", "model.gpt.num_layers=6", "model.gpt.num_heads=2",
             "model.gpt.intermediate_size=128", "model.gpt.max_positions=64", "data.kind=SYNTHETIC",
             "train.batch_per_gpu=8", "train.max_memory_mb=6"]
# A GPT whose logits (512 rows x 4096 words, 8 MiB in f32) exceed LOGITS' cap unless the head
# runs in chunks of rows.
LOGITS = ["model.name=gpt2", "model.gpt.vocab_size=4096", "model.gpt.seq_len=32", "model.gpt.max_positions=32",
          "model.gpt.hidden_size=16", "model.gpt.num_layers=1", "model.gpt.num_heads=2",
          "model.gpt.intermediate_size=32", "data.kind=SYNTHETIC", "train.batch_per_gpu=16",
          "train.max_memory_mb=6"]
# A tiny GPT-2 whose projections run in FP8 (emulated on the CPU): every size a multiple of 16.
FP8 = GPT + ["train.batch_per_gpu=4", "precision.fp8.enabled=true"]
# On the CPU, the loss scaler runs with O1 in bf16.
SCALED = ["precision.opt_level=O1", "precision.half=BF16", "precision.loss_scale.dynamic=true",
          "precision.loss_scale.init_scale=1024", "precision.loss_scale.growth_interval=1"]
# PowerSGD from the first step.
POWERSGD = ["parallel.compression=POWERSGD", "parallel.powersgd_start_step=0"]
AUGMENT = ["data.kind=FASHION_MNIST", f"data.path={FASHION}", "data.workers=0"]
# Whole epochs of Fashion-MNIST in a few large batches through a small MLP: seconds, not minutes.
EPOCH = AUGMENT + ["model.name=mlp", "model.mlp_hidden=16", "train.log_every=100", "schedule.warmup_steps=0"]

runs = 0
seen = {}


def run(overrides, env=None, mpi=0):
    """Runs kiln train once per distinct set of arguments; returns what the run showed."""
    key = (tuple(overrides), tuple(sorted((env or {}).items())), mpi)
    if key not in seen:
        seen[key] = run_once(overrides, env, mpi)
    return seen[key]


def run_once(overrides, env, mpi):
    global runs
    runs += 1
    d = os.path.join(WORK, f"run{runs}")
    os.makedirs(d)
    args = [KILN, "train", "--config", TINY]
    sets = list(BASE) + [f"logging.dir={d}/log"] + list(overrides)
    for s in sets:
        args += ["--set", s]
    if mpi:
        args = [os.environ.get("MPIEXEC") or "mpirun", "--allow-run-as-root", "--oversubscribe",
                "--timeout", "120", "-np", str(mpi)] + args
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(args, cwd=d, env=e, capture_output=True, text=True, timeout=300)
    shown = {"exit": p.returncode, "out": p.stdout + p.stderr, "dir": d}
    records = []
    for root, _, files in os.walk(d):
        if "metrics.jsonl" in files:
            records = [json.loads(l) for l in open(os.path.join(root, "metrics.jsonl"))]
    train = [r for r in records if "loss" in r]
    shown["losses"] = [r["loss"] for r in train]
    shown["lr"] = [r["lr"] for r in train]
    shown["scale"] = [r["loss_scale"] for r in train]
    shown["eval"] = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    m = re.search(r"\((\d+) parameters[,)]", shown["out"])
    shown["parameters"] = m.group(1) if m else None
    shown["files"] = sorted(os.path.relpath(os.path.join(r, f), d)
                            for r, _, fs in os.walk(d) for f in fs)
    weights = [os.path.join(r, "model.safetensors") for r, _, fs in os.walk(d)
               if "model.safetensors" in fs]
    shown["weights"] = hashlib.sha256(open(sorted(weights)[-1], "rb").read()).hexdigest() \
        if weights else None
    shown["state"] = "".join(open(os.path.join(r, "state.pbtxt")).read()
                             for r, _, fs in os.walk(d) if "state.pbtxt" in fs)
    shown["log_lines"] = len(re.findall(r"^step \d+/\d+", p.stdout, re.M))
    return shown


def fails_with(text):
    return lambda base, changed: changed["exit"] != 0 and text in changed["out"]


def fits_only_when_changed(base, changed):
    return base["exit"] != 0 and "out of memory" in base["out"] and changed["exit"] == 0


def differs(key):
    return lambda base, changed: base["exit"] == 0 and changed["exit"] == 0 and \
        base[key] != changed[key]


def resident_same_result(base, changed):
    """On the CPU, cuda_graphs keeps the step state resident: said, and bit for bit the same."""
    return base["exit"] == 0 and changed["exit"] == 0 and base["losses"] == changed["losses"] and \
        base["weights"] == changed["weights"] and "cuda_graphs: the CPU" in changed["out"] and \
        "cuda_graphs" not in base["out"]


def init_from_file():
    """A weights file written by a 1-step run of the tiny model with another seed."""
    shown = run(["train.steps=1", "schedule.warmup_steps=0", "train.seed=99"])
    assert shown["exit"] == 0, shown["out"]
    return [os.path.join(r, "model.safetensors") for r, _, fs in os.walk(shown["dir"])
            if "model.safetensors" in fs][0]


# field path -> (base overrides, changed overrides, predicate(base, changed), env for both)
CASES = {
    "name": ([], ["name=renamed"], lambda b, c: "renamed" in c["state"] and "renamed" not in b["state"]),
    "description": ([], ["description=a note"], lambda b, c: "a note" in c["state"]),
    "model.name": ([], ["model.name=mlp"], differs("parameters")),
    "model.num_classes": ([], ["model.num_classes=7"], differs("parameters")),
    "model.image_size": (["model.name=mlp"], ["model.name=mlp", "model.image_size=20"], differs("parameters")),
    "model.image_channels": (["model.name=mlp"], ["model.name=mlp", "model.image_channels=3"], differs("parameters")),
    "model.cifar_stem": (["model.name=resnet18", "model.image_size=16", "train.steps=2", "train.batch_per_gpu=2"],
                         ["model.name=resnet18", "model.image_size=16", "train.steps=2", "train.batch_per_gpu=2",
                          "model.cifar_stem=true"], differs("parameters")),
    "model.bert.vocab_size": (BERT, BERT + ["model.bert.vocab_size=80"], differs("parameters")),
    "model.bert.seq_len": (BERT, BERT + ["model.bert.seq_len=12"], differs("losses")),
    "model.bert.hidden_size": (BERT, BERT + ["model.bert.hidden_size=32"], differs("parameters")),
    "model.bert.num_layers": (BERT, BERT + ["model.bert.num_layers=2"], differs("parameters")),
    "model.bert.num_heads": (BERT, BERT + ["model.bert.num_heads=4"], differs("losses")),
    "model.bert.intermediate_size": (BERT, BERT + ["model.bert.intermediate_size=48"], differs("parameters")),
    "model.gpt.vocab_size": (GPT, GPT + ["model.gpt.vocab_size=80"], differs("parameters")),
    "model.gpt.seq_len": (GPT, GPT + ["model.gpt.seq_len=12"], differs("losses")),
    "model.gpt.hidden_size": (GPT, GPT + ["model.gpt.hidden_size=32"], differs("parameters")),
    "model.gpt.num_layers": (GPT, GPT + ["model.gpt.num_layers=2"], differs("parameters")),
    "model.gpt.num_heads": (GPT, GPT + ["model.gpt.num_heads=4"], differs("losses")),
    "model.gpt.intermediate_size": (GPT, GPT + ["model.gpt.intermediate_size=48"], differs("parameters")),
    "model.gpt.max_positions": (GPT, GPT + ["model.gpt.max_positions=32"], differs("parameters")),
    "model.dropout": (BERT, BERT + ["model.dropout=0.3"], differs("losses")),
    "model.init_from": ([], ["model.init_from=@INIT"], differs("losses")),
    # config.json's n_layer (2) fills the one field GPT leaves out here (the others agree).
    "model.from_hf_config": ([o for o in GPT if "num_layers" not in o] + ["model.gpt.num_layers=1"],
                             [o for o in GPT if "num_layers" not in o] + ["model.from_hf_config=@HF"],
                             differs("parameters")),
    # LoRA (tests/infer/test_lora.cc and tests/train/test_lora_sft.sh show what the adapters do).
    "model.lora.rank": (LLAMA_SHARDS, LLAMA_SHARDS + ["model.lora.rank=2"],
                        lambda b, c: differs("parameters")(b, c) and "trained (LoRA adapters)" in c["out"]),
    "model.lora.alpha": (LLAMA_SHARDS + ["model.lora.rank=2"],
                         LLAMA_SHARDS + ["model.lora.rank=2", "model.lora.alpha=64"], differs("losses")),
    "model.lora.dropout": (LLAMA_SHARDS + ["model.lora.rank=2"],
                           LLAMA_SHARDS + ["model.lora.rank=2", "model.lora.dropout=0.5"], differs("losses")),
    "model.lora.targets": (LLAMA_SHARDS + ["model.lora.rank=2"],
                           LLAMA_SHARDS + ["model.lora.rank=2", "model.lora.targets=down_proj"],
                           differs("parameters")),
    "model.mlp_hidden": (["model.name=mlp"], ["model.name=mlp", "model.mlp_hidden=64"], differs("parameters")),
    "data.kind": ([], ["data.kind=FASHION_MNIST", "data.workers=0"], differs("losses")),
    "data.path": (AUGMENT, AUGMENT + [f"data.path={WORK}"], fails_with("no such file")),
    "data.shuffle": (AUGMENT, AUGMENT + ["data.shuffle=false"], differs("losses")),
    "data.drop_last": (EPOCH + ["train.epochs=1", "train.batch_per_gpu=7000"],
                       EPOCH + ["train.epochs=1", "train.batch_per_gpu=7000", "data.drop_last=false"],
                       differs("files")),
    # BERT's [MASK] is token 103: a vocabulary of 128.
    "data.mlm_probability": (BERT + ["model.bert.vocab_size=128", "data.kind=TOKENS", "data.path=@TOKENS"],
                             BERT + ["model.bert.vocab_size=128", "data.kind=TOKENS", "data.path=@TOKENS",
                                     "data.mlm_probability=0.5"],
                             differs("losses")),
    # The default evaluates tiny_val_*.bin (data.path's "train" replaced by "val").
    "data.eval_path": (SHARDS, SHARDS + ["data.eval_path=@SHARDS/other_val_*.bin"], differs("eval")),
    # -1: the first shard's first token begins each document; windows then pack documents that
    # attend only to themselves (tests/layers/test_packed_documents.cc shows the equivalence).
    "data.document_boundary_token": (LLAMA_SHARDS, LLAMA_SHARDS + ["data.document_boundary_token=-1"],
                                     differs("losses")),
    "data.eval_split": ([], ["data.eval_split=train", "train.eval_batches=1"], differs("eval")),
    "data.augmentation.random_crop_padding": (AUGMENT, AUGMENT + ["data.augmentation.random_crop_padding=4"], differs("losses")),
    "data.augmentation.horizontal_flip": (AUGMENT, AUGMENT + ["data.augmentation.horizontal_flip=true"], differs("losses")),
    "data.augmentation.normalize_mean": (AUGMENT, AUGMENT + ["data.augmentation.normalize_mean=0.5",
                                                             "data.augmentation.normalize_std=1"], differs("losses")),
    "data.augmentation.normalize_std": (AUGMENT + ["data.augmentation.normalize_mean=0.5", "data.augmentation.normalize_std=1"],
                                        AUGMENT + ["data.augmentation.normalize_mean=0.5", "data.augmentation.normalize_std=0.25"],
                                        differs("losses")),
    "optimizer.kind": ([], ["optimizer.kind=SGD"], differs("losses")),
    "optimizer.lr": ([], ["optimizer.lr=0.01"], differs("lr")),
    "optimizer.momentum": (["optimizer.kind=SGD"], ["optimizer.kind=SGD", "optimizer.momentum=0.5"], differs("losses")),
    "optimizer.nesterov": (["optimizer.kind=SGD"], ["optimizer.kind=SGD", "optimizer.nesterov=true"], differs("losses")),
    "optimizer.weight_decay": ([], ["optimizer.weight_decay=0.5", "optimizer.lr=0.05"], differs("weights")),
    "optimizer.betas": ([], ["optimizer.betas=0.5,0.9"], differs("losses")),
    "optimizer.eps": ([], ["optimizer.eps=0.1"], differs("losses")),
    "optimizer.amsgrad": ([], ["optimizer.amsgrad=true"], differs("losses")),
    "optimizer.bias_correction": (["optimizer.kind=LAMB"], ["optimizer.kind=LAMB", "optimizer.bias_correction=false"], differs("losses")),
    "optimizer.max_grad_norm": ([], ["optimizer.max_grad_norm=0.01"], differs("losses")),
    "optimizer.no_weight_decay_for_bias_and_norm": (["optimizer.weight_decay=0.5", "optimizer.lr=0.05"],
                                                    ["optimizer.weight_decay=0.5", "optimizer.lr=0.05",
                                                     "optimizer.no_weight_decay_for_bias_and_norm=false"], differs("weights")),
    "optimizer.moments_dtype": ([], ["optimizer.moments_dtype=BF16"], differs("weights")),
    "optimizer.param_groups.name_pattern": ([], ["optimizer.param_groups[0]={name_pattern: \"*.bias\" lr_multiplier: 0}"], differs("weights")),
    "optimizer.param_groups.lr_multiplier": (["optimizer.param_groups[0]={name_pattern: \"*\"}"],
                                             ["optimizer.param_groups[0]={name_pattern: \"*\" lr_multiplier: 3}"], differs("losses")),
    "optimizer.param_groups.weight_decay": (["optimizer.param_groups[0]={name_pattern: \"*\"}", "optimizer.lr=0.05"],
                                            ["optimizer.param_groups[0]={name_pattern: \"*\" weight_decay: 0.5}", "optimizer.lr=0.05"],
                                            differs("weights")),
    "schedule.kind": ([], ["schedule.kind=CONSTANT"], differs("lr")),
    "schedule.warmup_steps": ([], ["schedule.warmup_steps=3"], differs("lr")),
    "schedule.min_lr": ([], ["schedule.min_lr=0.0005"], differs("lr")),
    "schedule.power": (["schedule.kind=WARMUP_POLY"], ["schedule.kind=WARMUP_POLY", "schedule.power=2"], differs("lr")),
    "schedule.step_size": (["schedule.kind=STEP", "schedule.step_size=1", "schedule.warmup_steps=0"],
                           ["schedule.kind=STEP", "schedule.step_size=2", "schedule.warmup_steps=0"], differs("lr")),
    "schedule.gamma": (["schedule.kind=STEP", "schedule.step_size=1", "schedule.warmup_steps=0"],
                       ["schedule.kind=STEP", "schedule.step_size=1", "schedule.warmup_steps=0", "schedule.gamma=0.5"], differs("lr")),
    # FP8 projections: the CPU emulates the casts (tests/layers/test_fp8_projection.cc; on the GPU,
    # test_layers_fp8_projection_gpu compares CUDA with the emulation).
    "precision.fp8.enabled": (GPT + ["train.batch_per_gpu=4"], FP8, differs("losses")),
    "precision.fp8.recipe": (FP8, FP8 + ["precision.fp8.recipe=CURRENT"], differs("losses")),
    "precision.fp8.amax_history": (FP8 + ["train.steps=6"], FP8 + ["train.steps=6", "precision.fp8.amax_history=1"],
                                   differs("losses")),
    "precision.fp8.margin": (FP8, FP8 + ["precision.fp8.margin=3"], differs("losses")),
    "precision.fp8.gradient_format": (FP8, FP8 + ["precision.fp8.gradient_format=E4M3"], differs("losses")),
    "precision.opt_level": ([], ["precision.opt_level=O1", "precision.half=BF16"], differs("losses")),
    "precision.half": (["precision.opt_level=O1", "precision.half=BF16"], ["precision.opt_level=O1", "precision.half=FP16"],
                       fails_with("FP16")),
    "precision.loss_scale.dynamic": (SCALED, SCALED + ["precision.loss_scale.dynamic=false"], differs("scale")),
    "precision.loss_scale.init_scale": (SCALED, SCALED + ["precision.loss_scale.init_scale=4096"], differs("scale")),
    "precision.loss_scale.growth_factor": (SCALED, SCALED + ["precision.loss_scale.growth_factor=4"], differs("scale")),
    "precision.loss_scale.growth_interval": (SCALED, SCALED + ["precision.loss_scale.growth_interval=2"], differs("scale")),
    "precision.loss_scale.static_scale": (SCALED + ["precision.loss_scale.dynamic=false", "precision.loss_scale.static_scale=8"],
                                          SCALED + ["precision.loss_scale.dynamic=false", "precision.loss_scale.static_scale=16"],
                                          differs("scale")),
    "precision.loss_scale.max_scale": (SCALED, SCALED + ["precision.loss_scale.max_scale=2048"], differs("scale")),
    "precision.loss_scale.backoff_factor": (SCALED + ["@INF"], SCALED + ["@INF", "precision.loss_scale.backoff_factor=0.25"], differs("scale")),
    "precision.loss_scale.min_scale": (SCALED + ["@INF", "precision.loss_scale.min_scale=1"],
                                       SCALED + ["@INF", "precision.loss_scale.min_scale=512"],
                                       fails_with("overflow at the minimum scale 512")),
    "parallel.allreduce_in_half": (["@NP2"], ["@NP2", "parallel.allreduce_in_half=true", "precision.half=BF16"], differs("losses")),
    "parallel.backend": (["@NP2"], ["@NP2", "parallel.backend=NCCL"], fails_with("NCCL")),
    "parallel.compression": (["@NP2"], ["@NP2"] + POWERSGD, differs("losses")),
    "parallel.powersgd_rank": (["@NP2"] + POWERSGD, ["@NP2"] + POWERSGD + ["parallel.powersgd_rank=1"], differs("losses")),
    "parallel.powersgd_start_step": (["@NP2"] + POWERSGD, ["@NP2"] + POWERSGD + ["parallel.powersgd_start_step=2"],
                                     differs("losses")),
    "train.device": ([], ["train.device=CUDA"], fails_with("CUDA")),
    "train.steps": ([], ["train.steps=3"], differs("losses")),
    "train.epochs": (EPOCH + ["train.epochs=1", "train.batch_per_gpu=12000"],
                     EPOCH + ["train.epochs=0.5", "train.batch_per_gpu=12000"], differs("files")),
    "train.batch_per_gpu": ([], ["train.batch_per_gpu=8"], differs("losses")),
    "train.accumulation_steps": ([], ["train.accumulation_steps=2"], differs("losses")),
    "train.global_batch": ([], ["train.global_batch=32"], differs("losses")),
    "train.eval_every": (["data.eval_split=train", "train.eval_batches=1"],
                         ["data.eval_split=train", "train.eval_batches=1", "train.eval_every=2"], differs("eval")),
    "train.eval_batches": (["data.eval_split=train", "train.eval_batches=1"], ["data.eval_split=train", "train.eval_batches=2"],
                           differs("eval")),
    "train.seed": ([], ["train.seed=8"], differs("losses")),
    "train.log_every": ([], ["train.log_every=2"], differs("log_lines")),
    "train.cuda_graphs": (SCALED, SCALED + ["train.cuda_graphs=true"], resident_same_result),
    "train.max_memory_mb": ([], ["train.max_memory_mb=1"], fails_with("memory")),
    "train.recompute": (RECOMPUTE, RECOMPUTE + ["train.recompute=BLOCKS"], fits_only_when_changed),
    "train.lm_head_chunks": (LOGITS, LOGITS + ["train.lm_head_chunks=8"], fits_only_when_changed),
    "train.offload": "tests/train/test_offload.sh: the update runs on host twins bit for bit as on the device, "
                     "kiln plan counts masters and moments as host memory; "
                     "OPTIMIZER_AND_WEIGHTS runs ZeRO-3's shards from host memory on one rank and two "
                     "(zero3_gathers_per_step in metrics.jsonl) and is refused without stage 3",
    "train.loss_average": "tests/train/test_loss_average.sh: on masked shards AUTO/STEP_TOKENS train 2 micro-batches "
                          "or 2 ranks as one batch, MICRO_BATCHES does not",
    "train.offload_update": "tests/train/test_offload.sh: DEVICE_KERNELS keeps resident steps and ZeRO-1 on 2 ranks, "
                            "HOST_CORES turns them off and updates twins of each rank's ZeRO shard on 2 ranks",
    "train.preemption_grace_s": "tests/train/test_preemption_grace.sh: past the grace period the process exits 1 naming it",
    "train.deterministic": "test_train_run_setup (RunSetup.DeterministicSetsReductionOrder): NCCL_ALGO, cuBLAS workspace and "
                           "heuristic cuDNN algorithms; bit-identical GPU runs in test_gpu_attention_resume.sh",
    "checkpoint.dir": ([], ["checkpoint.dir=@DIR/elsewhere"], differs("files")),
    "checkpoint.every_steps": ([], ["checkpoint.every_steps=2"], differs("files")),
    "checkpoint.keep_last": (["checkpoint.every_steps=1"], ["checkpoint.every_steps=1", "checkpoint.keep_last=1"], differs("files")),
    "checkpoint.resume": "tests/train/test_exact_resume.sh: checkpoint.resume latest continues bit for bit",
    "logging.dir": ([], ["logging.dir=@DIR/elsewhere"], differs("files")),
    "logging.jsonl": ([], ["logging.jsonl=false"], differs("files")),
    "logging.tensorboard": ([], ["logging.tensorboard=true"], differs("files")),
    "logging.progress": "tests/train/test_progress.sh: AUTO in a terminal, a file and under mpirun; ON/OFF in test_train_run_setup",
    "data.workers": "test_train_run_setup (RunSetup.LoaderOptionsFollowTheExperiment): the loader gets data.workers",
    "data.prefetch": "test_train_run_setup (RunSetup.LoaderOptionsFollowTheExperiment): the loader gets data.prefetch",
    "data.decode": ([], ["data.decode=GPU"], fails_with("data.decode")),
    "data.on_corrupt_image": "test_train_run_setup (RunSetup.DatasetOptionsFollowTheExperiment); SKIP/FAIL in test_data_readers",
    "data.augmentation.random_resized_crop_scale": "test_train_run_setup (RunSetup.DatasetOptionsFollowTheExperiment) and the JPEG augmentation tests",
    "model.fuse_conv_batch_norm": "CUDA only (cuDNN's fused engines): test_layers_conv_gpu (ConvGpuTest.ResNetFusedBatchNormEqualsTheLayers) "
                                  "on the GPU machine; test_train_units (ModelOptions.ConvBatchNormFusionFollowsTheExperiment)",
    "model.memory_format": "CUDA only (NHWC convolutions): test_layers_conv_gpu on the GPU machine; test_train_run_setup (RunSetup.ChannelsLast)",
    "parallel.bucket_mb": "test_comm_mpi (DataParallelCpu): bucket layouts of every size give the same sums",
    "parallel.first_bucket_mb": "test_comm_mpi (DataParallel.SmallFirstBucketClosesEarly) and tests/train/test_bench_comm.sh: a bucket of its own for the last layer",
    "parallel.collective_timeout_s": "tests/train/test_faults.sh and test_comm_rank_hang: a hung rank ends the job after the timeout",
    "parallel.zero3_gather_once_per_step": ([], ["parallel.zero3_gather_once_per_step=true"],
                                            fails_with("parallel.zero3_gather_once_per_step")),
    "parallel.zero_accumulate_in_shards": "test_comm_mpi (DataParallel.ZeroAccumulationInShardsReducesEachMicroStep): each "
                                          "micro-step reduced, full buffers released between; tests/train/test_zero.sh "
                                          "stages 2 and 3 on 2 and 3 ranks, test_offload.sh its default with OPTIMIZER_AND_WEIGHTS",
    "parallel.zero_stage": "tests/train/test_zero.sh: stages 1 and 2 shard the optimizer state (per-rank bytes fall by the "
                           "world size) and write one optimizer shard file per rank",
}


def expand(overrides, case_dir):
    env, mpi, out = {}, 0, []
    for o in overrides:
        if o == "@INF":
            env = {"KILN_FAULT_KIND": "inf-grad-always", "KILN_FAULT_STEP": "1"}
        elif o == "@NP2":
            mpi = 2
        else:
            o = o.replace("@INIT", INIT).replace("@TOKENS", TOKENS).replace("@SHARDS", SHARDS_DIR)
            o = o.replace("@HF", HF_CONFIG)
            o = o.replace("@DIR", case_dir)
            out.append(o)
    return out, env, mpi


def schema_fields():
    """Leaf field paths of the experiment, from kiln config --json over a config that sets every
    optional message."""
    paths = set()

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            walk(prefix, value[0])
        else:
            paths.add(prefix)
    image = AUGMENT + ["data.augmentation.normalize_mean=0.5", "data.augmentation.normalize_std=1",
                       "data.augmentation.random_resized_crop_scale=0.5,1",
                       "optimizer.param_groups[0]={name_pattern: \"*\"}"]
    for sets in (BERT, image):
        args = [KILN, "config", "--config", TINY, "--json"]
        for s in sets:
            args += ["--set", s]
        p = subprocess.run(args, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        walk("", json.loads(p.stdout))
    paths.add("train.epochs")  # the oneof member not set in the tiny config
    paths.add("train.steps")
    # An empty list of messages in one printout is the messages' fields in the other.
    return {p for p in paths if not any(q.startswith(p + ".") for q in paths)}


def write_tokens():
    """A TOKENS dataset in Kiln's token-file format (data/token_dataset.h): train.tok, test.tok."""
    import random
    import struct
    d = os.path.join(WORK, "tokens")
    os.makedirs(d, exist_ok=True)
    rng = random.Random(0)
    for name in ("train.tok", "test.tok"):
        tokens = [rng.randrange(5, 64) for _ in range(4096)]
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"KILNTOK\0" + struct.pack("<IIQQ", 1, 4, 128, len(tokens)))
            f.write(struct.pack(f"<{len(tokens)}I", *tokens))
    return d


def write_hf_config():
    """A transformers GPT2Config of GPT's shape with 2 layers (tests/train/test_hf_folders.sh
    checks the rest of model.from_hf_config and of Hugging Face folders)."""
    path = os.path.join(WORK, "hf_config.json")
    with open(path, "w") as f:
        json.dump({"model_type": "gpt2", "vocab_size": 64, "n_embd": 16, "n_layer": 2, "n_head": 2,
                   "n_inner": 32, "n_positions": 16}, f)
    return path


def write_llmc_shards():
    """LLMC_SHARDS data in llm.c's format (data/llmc_shards.h): two training shards and two sets
    of validation shards with different tokens."""
    import random
    import struct
    d = os.path.join(WORK, "shards")
    os.makedirs(d, exist_ok=True)
    for seed, name in enumerate(("tiny_train_000001.bin", "tiny_train_000002.bin",
                                 "tiny_val_000000.bin", "other_val_000000.bin")):
        rng = random.Random(seed)
        tokens = [rng.randrange(64) for _ in range(2048)]
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    return d


missing = sorted(schema_fields() - set(CASES))
assert not missing, f"fields with no case in settings_act.py (add one that shows what they change): {missing}"
INIT = init_from_file()
TOKENS = write_tokens()
SHARDS_DIR = write_llmc_shards()
HF_CONFIG = write_hf_config()
only = os.environ.get("SETTINGS_ONLY")
failures = []
for field, case in CASES.items():
    if only and not re.search(only, field):
        continue
    if isinstance(case, str):
        print(f"{field}: {case}")
        continue
    base_o, changed_o, check = case
    case_dir = os.path.join(WORK, "case-" + field.replace(".", "_"))
    os.makedirs(case_dir, exist_ok=True)
    b, env_b, np_b = expand(base_o, case_dir)
    c, env_c, np_c = expand(changed_o, case_dir)
    base = run(b, env_b, np_b)
    changed = run(c, env_c, np_c)
    ok = False
    try:
        ok = bool(check(base, changed))
    except Exception as error:  # a missing key or a crash of the check is a failure too
        ok = False
        changed["out"] += f"\n(check raised {error!r})"
    status = "acts" if ok else "NO EFFECT SEEN"
    print(f"{field}: {status} ({' '.join(changed_o)})")
    if not ok:
        failures.append(field)
        print("  base exit", base["exit"], base["out"][-600:])
        print("  changed exit", changed["exit"], changed["out"][-600:])
if failures:
    print("FAIL: settings with no effect seen:", ", ".join(failures))
    sys.exit(1)
print(f"PASS: every setting acts ({runs} runs)")
