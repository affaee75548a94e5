#!/usr/bin/env python3
"""Hands every `planner export` of a matrix of plans to the stack's own configuration code.

For each plan of the matrix (Llama 3 8B and 70B, Mixtral 8x7B; tp 1/2/8, pp 1/4 with 1F1B, GPipe
and interleaving, ZeRO 0-3, cp 2, hybrid shard, every recompute mode, fp8, and the sample plans)
and each stack (torchtitan, DeepSpeed, Accelerate, LitGPT, Megatron), the planner writes the export or
refuses it. A written export must be accepted by the stack's parser on CPU and give back the
plan's degrees, batch sizes, schedule, recompute and precision; a refusal must name the stack and
say what it cannot express.

  torchtitan   ConfigManager.parse_args on the TOML; ParallelDims over a fake process group of
               the plan's world size; the train spec's model on the meta device, parallelized (tp,
               FSDP2, activation checkpointing) or split into pipeline stages with its schedule,
               exactly as torchtitan/train.py's Trainer does before it touches a GPU.
  deepspeed    DeepSpeedConfig (what deepspeed.initialize builds) under a fake process group of
               the plan's world size: batch arithmetic, ZeRO stage, precision, AutoTP, and
               AutoEP's own config and folding checks (engine.py _configure_expert_parallel).
  accelerate   `accelerate launch --config_file`'s own parser and validation, the environment it
               hands the script, then FullyShardedDataParallelPlugin and ParallelismConfig built
               from that environment, as the Accelerator does.
  litgpt       the recipe's own jsonargparse parser (as litgpt/__main__.py's CLI builds it from
               setup()): config read, classes instantiated, TrainArgs' accumulation arithmetic,
               litgpt.Config for the model, and the layout the recipe's code builds.
  megatron     the script run with a stand-in torchrun that records its arguments (nothing else
               runs); megatron-core's TransformerConfig built from them (its __post_init__ is
               Megatron's validation of the model and parallel settings), and Megatron-LM's own
               parse_args + validate_args when a checkout is given (--megatron-lm or MEGATRON_LM).

Usage: stack_parsers.py --planner BUILD/planner/planner --work DIR [--stacks a,b] [--megatron-lm PATH]
Exit 0: every export accepted with the plan's values and every refusal explained; 1: not;
77: a stack's package is not installed (scripts/setup.sh test installs them, pinned in
tests/export/requirements.txt).
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

STACKS = {"torchtitan": "toml", "deepspeed": "json", "accelerate": "yaml", "litgpt": "yaml", "megatron": "sh"}
MODULES = {"torchtitan": "torchtitan", "deepspeed": "deepspeed", "accelerate": "accelerate", "litgpt": "litgpt", "megatron": "megatron.core"}

# The plan matrix: name -> planner arguments. Every setting that an export writes is fixed, so
# the plan is the one named (the search picks what is left, the micro-batch, within it).
MATRIX = {
    "8b-fsdp8": "--model 8b --gpus 8 --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=full",
    "8b-fsdp8-expandable": "--model 8b --gpus 8 --allocator expandable-segments --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=full",
    "8b-zero2-sel": "--model 8b --gpus 16 --fix tp=1 --fix pp=1 --fix zero=2 --fix recompute=selective",
    "8b-zero1": "--model 8b --gpus 16 --fix tp=1 --fix pp=1 --fix zero=1 --fix recompute=full",
    "8b-ddp": "--model 8b --gpus 16 --fix tp=1 --fix pp=1 --fix zero=0 --fix recompute=full --seq-len 2048",
    "8b-tp2-fsdp": "--model 8b --gpus 16 --fix tp=2 --fix pp=1 --fix zero=3 --fix recompute=none",
    "8b-tp2-ddp": "--model 8b --gpus 16 --fix tp=2 --fix pp=1 --fix zero=0 --fix recompute=full --seq-len 2048",
    "8b-cp2": "--model 8b --gpus 16 --fix tp=1 --fix pp=1 --fix cp=2 --fix zero=3 --fix recompute=full --seq-len 32768",
    "8b-hsdp": "--model 8b --gpus 32 --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=8 --fix recompute=full",
    # Planned for FSDP1 (Accelerate writes fsdp_version 1): SHARD_GRAD_OP, and HYBRID_SHARD within a node.
    "8b-fsdp1-zero2": "--model 8b --gpus 16 --stack fsdp1 --fix tp=1 --fix pp=1 --fix zero=2 --fix recompute=full --seq-len 4096",
    "8b-fsdp1-hybrid": "--model 8b --gpus 16 --stack fsdp1 --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=8 --fix recompute=full --seq-len 4096",
    "8b-fp16-tp2": "--model 8b --gpus 16 --precision fp16 --fix tp=2 --fix pp=1 --fix zero=1 --fix recompute=selective --seq-len 4096",
    "8b-fp8": "--model 8b --gpus 8 --precision fp8 --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=full",
    "8b-fp8-current": "--model 8b --gpus 8 --precision fp8 --fp8-recipe current --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=full",
    # torchao's fp8 all-gather under FSDP2 (torchtitan only; the other exports refuse it).
    "8b-fp8-all-gather": "--model 8b --gpus 8 --precision fp8 --stack fsdp2-compile --fp8-all-gather --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=selective",
    "70b-tp8-pp4-1f1b": "--model 70b --gpus 64 --fix tp=8 --fix pp=4 --fix zero=1 --fix schedule=1f1b --fix recompute=selective",
    "70b-tp8-pp4-int": "--model 70b --gpus 64 --fix tp=8 --fix pp=4 --fix zero=1 --fix schedule=interleaved --fix v=2 --fix recompute=selective",
    "70b-tp8-pp4-gpipe": "--model 70b --gpus 64 --fix tp=8 --fix pp=4 --fix zero=1 --fix schedule=gpipe --fix recompute=full --global-batch 32 --seq-len 4096",
    # Llama 3's pipeline (Dubey et al. 2024 Sec. 3.3.2): the embedding and the loss a chunk each, 126 + 2 layers in 16 x 8.
    "405b-pp16-ends-in-split": "--model 405b --gpus 1024 --stack megatron-te --fix tp=8 --fix pp=16 --fix schedule=interleaved --fix v=8 --fix ends_in_split=on --fix zero=1 --fix recompute=selective",
    "70b-tp8-pp4-zero0": "--model 70b --gpus 64 --fix tp=8 --fix pp=4 --fix zero=0 --fix schedule=1f1b --fix recompute=full",
    "70b-tp8-fsdp": "--model 70b --gpus 64 --fix tp=8 --fix pp=1 --fix zero=3 --fix recompute=full",
    "70b-tp8-hsdp": "--model 70b --gpus 128 --fix tp=8 --fix pp=1 --fix zero=3 --fix shard_group=8 --fix recompute=full",
    "70b-tp8-pp2-cp2": "--model 70b --gpus 128 --fix tp=8 --fix pp=2 --fix cp=2 --fix zero=1 --fix schedule=1f1b --fix recompute=selective",
    "70b-fsdp64": "--model 70b --gpus 64 --fix tp=1 --fix pp=1 --fix zero=3 --fix recompute=full --seq-len 4096",
    "mixtral-ep8": "--model mixtral --gpus 64 --fix tp=1 --fix pp=1 --fix ep=8 --fix zero=1 --fix recompute=full --seq-len 4096",
    "mixtral-tp2-ep4-pp2": "--model mixtral --gpus 64 --fix tp=2 --fix pp=2 --fix ep=4 --fix zero=1 --fix schedule=1f1b --fix recompute=full --seq-len 4096",
    # The layouts LitGPT's recipes fix in code: pretrain HYBRID_SHARD within a node without
    # recompute, finetune_full FULL_SHARD (both FSDP1 reducing in bf16: planned for fsdp1) and
    # finetune_lora fully_shard with every block recomputed, QLoRA on one GPU.
    "8b-pretrain-hybrid": "--model 8b --gpus 16 --stack fsdp1 --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=8 --fix recompute=none --seq-len 2048",
    "8b-full-fsdp16": "--model 8b --gpus 16 --stack fsdp1 --mode full --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=16 --fix recompute=full --seq-len 4096",
    "8b-lora-fsdp8": "--model 8b --gpus 8 --mode lora --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=8 --fix recompute=full --seq-len 4096",
    "8b-qlora-1gpu": "--model 8b --gpus 1 --mode qlora --fix recompute=none --seq-len 2048",
}
# Plans as users keep them: the samples and the export tests' plans.
PLAN_FILES = [os.path.join(ROOT, "samples", "plans", f) for f in sorted(os.listdir(os.path.join(ROOT, "samples", "plans")))] + [
    os.path.join(ROOT, "tests", "data", "export", f) for f in sorted(os.listdir(os.path.join(ROOT, "tests", "data", "export"))) if f.endswith(".plan.json")
]


def default_reduce_dtype(training):
    """The planner's default_reduce_dtype (costmodel/src/documents/plan.cpp): the 16-bit dtype in
    pure 16-bit training, else the stack's (StackSpec::reduce_dtype: bf16 for fsdp1 and the
    deepspeed stacks and hf-fsdp2, fp32 for the others)."""
    if not training.get("master_weights", True):
        return "fp16" if training.get("precision") == "fp16" else "bf16"
    return "bf16" if training.get("stack", "trainplan") in ("fsdp1", "composer", "deepspeed", "deepspeed-v0.3", "hf-fsdp2") else "fp32"


def plan_values(plan):
    """What every export must give back: the plan's own numbers."""
    p, t = plan["parallel"], plan["training"]
    pv = {
        "gpus": plan["gpus"], "tp": p.get("tp", 1), "pp": p.get("pp", 1), "cp": p.get("cp", 1), "ep": p.get("ep", 1), "dp": p.get("dp", 1),
        "zero": p.get("zero_stage", 0), "shard_group": p.get("shard_group", 0), "micro_batch": p.get("micro_batch", 1),
        "global_batch": t["global_batch"], "seq_len": t["seq_len"], "precision": t.get("precision", "bf16"),
        "schedule": p.get("schedule", "1f1b"), "virtual_stages": p.get("virtual_stages", 1), "recompute": p.get("recompute", "none"),
        "sequence_parallel": p.get("sequence_parallel", p.get("tp", 1) > 1), "mode": t.get("mode", "pretrain"),
        "master_weights": t.get("master_weights", True), "lora_rank": t.get("lora", {}).get("rank", 16),
        "fp8_recipe": t.get("fp8_recipe", "stack"), "stack": t.get("stack", "trainplan"), "allocator": t.get("allocator", "caching"),
        "fp8_all_gather": t.get("fp8_all_gather", False),
        "reduce_dtype": p.get("reduce_dtype", default_reduce_dtype(t)), "prefetch": p.get("prefetch", True),
    }
    pv["arch"] = cluster_arch(plan.get("cluster", ""))
    pv["accumulation"] = pv["global_batch"] // (pv["micro_batch"] * pv["dp"])
    return pv


def expect(errors, what, got, want):
    if got != want:
        errors.append(f"{what}: the stack reads {got!r}, the plan has {want!r}")


# ----------------------------------------------------------------------------------------------
# torchtitan
def check_torchtitan(path, pv):
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols import train_spec as train_spec_module
    import torchtitan.models  # noqa: F401  (registers the train specs)

    # The meshes on CPU over a fake process group (no GPU, no peers): the same degrees and checks.
    parallel_dims_module.device_type = "cpu"
    cfg = ConfigManager().parse_args(["--job.config_file", path])
    # A flavor the export asks the user to register (a shape torchtitan has no preset for).
    for line in open(path):
        m = re.match(r"#\s+(\w+_args\[.*\] = \w+\(.*\))$", line.strip())
        if m:
            exec(m.group(1), vars(importlib.import_module("torchtitan.models." + cfg.model.name)))
    errors = []
    p = cfg.parallelism
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=pv["gpus"])
    try:
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                            tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
                            etp=p.expert_tensor_parallel_degree, world_size=pv["gpus"])
        expect(errors, "tensor_parallel_degree", dims.tp, pv["tp"])
        expect(errors, "pipeline_parallel_degree", dims.pp, pv["pp"])
        expect(errors, "context_parallel_degree", dims.cp, pv["cp"])
        expect(errors, "expert_parallel_degree", dims.ep, pv["ep"])
        expect(errors, "data parallel (replicate x shard)", dims.dp_replicate * dims.dp_shard, pv["dp"])
        if pv["zero"] == 3 and pv["shard_group"]:
            expect(errors, "data_parallel_shard_degree", dims.dp_shard, pv["shard_group"])
        expect(errors, "training.global_batch_size", cfg.training.global_batch_size, pv["global_batch"])
        expect(errors, "training.seq_len", cfg.training.seq_len, pv["seq_len"])
        param_dtype = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32", "fp16": "float16"}[pv["precision"]]
        if dims.fsdp_enabled or dims.dp_replicate > 1:
            expect(errors, "training.mixed_precision_param", cfg.training.mixed_precision_param, param_dtype)
        elif dims.tp_enabled or dims.pp_enabled:
            # distributed/utils.py maybe_enable_amp: no FSDP or CP beside TP or PP turns mixed precision off.
            expect(errors, "the dtype torchtitan trains in (TP or PP without FSDP or CP)", "float32", param_dtype)
        expect(errors, "activation_checkpoint.mode", cfg.activation_checkpoint.mode, pv["recompute"])
        if pv["recompute"] == "selective":  # the per-operator policy the fsdp2 stacks price
            expect(errors, "activation_checkpoint.selective_ac_option", cfg.activation_checkpoint.selective_ac_option, "op")
        # The fsdp2-compile stack: the blocks and the loss under torch.compile (train.py's apply_compile,
        # components/loss.py); the eager stacks leave it off.
        expect(errors, "compile.enable", cfg.compile.enable, pv["stack"] == "fsdp2-compile")
        if cfg.compile.enable:
            expect(errors, "compile.components", sorted(cfg.compile.components), ["loss", "model"])
        if pv["precision"] == "fp8":
            expect(errors, "model.converters", "quantize.linear.float8" in cfg.model.converters, True)
            f8 = cfg.quantize.linear.float8
            expect(errors, "quantize.linear.float8.enable_fsdp_float8_all_gather", f8.enable_fsdp_float8_all_gather, pv["fp8_all_gather"])
            expect(errors, "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", f8.precompute_float8_dynamic_scale_for_fsdp,
                   pv["fp8_all_gather"])
            # components/quantization/float8.py asserts recipe_name is None beside the fp8 all-gather
            # (tensorwise is torchao's default then).
            expect(errors, "quantize.linear.float8.recipe_name", f8.recipe_name, None if pv["fp8_all_gather"] else "tensorwise")
        # Train.py's batch arithmetic: local batch x batch degree x accumulation = global.
        batch_degree = dims.dp_replicate * dims.dp_shard
        if cfg.training.global_batch_size % (cfg.training.local_batch_size * batch_degree):
            errors.append(f"global batch {cfg.training.global_batch_size} is not a multiple of local batch {cfg.training.local_batch_size} x dp {batch_degree}")
        accumulation = cfg.training.global_batch_size // (cfg.training.local_batch_size * batch_degree)
        spec = train_spec_module.get_train_spec(cfg.model.name)
        model_args = spec.model_args[cfg.model.flavor]
        model_args.update_from_config(cfg)
        with torch.device("meta"):
            model = spec.model_cls(model_args)
        if dims.pp_enabled:
            loss_fn = spec.build_loss_fn(cfg, parallel_dims=dims)
            schedule, parts, _, _ = spec.pipelining_fn(model, dims, cfg, torch.device("cpu"), model_args, spec.parallelize_fn, loss_fn)
            expect(errors, "pipeline micro-batch", p.pipeline_parallel_microbatch_size, pv["micro_batch"])
            expect(errors, "pipeline micro-batches per step", schedule._n_microbatches, pv["accumulation"])
            kind = {"Schedule1F1B": "1f1b", "ScheduleGPipe": "gpipe", "ScheduleInterleaved1F1B": "interleaved"}.get(type(schedule).__name__, type(schedule).__name__)
            expect(errors, "pipeline schedule", kind, pv["schedule"])
            expect(errors, "model chunks on this rank", len(parts), pv["virtual_stages"])
        else:
            spec.parallelize_fn(model, dims, cfg)
            expect(errors, "local_batch_size", cfg.training.local_batch_size, pv["micro_batch"])
            expect(errors, "gradient accumulation steps", accumulation, pv["accumulation"])
    finally:
        dist.destroy_process_group()
    return errors


# ----------------------------------------------------------------------------------------------
# DeepSpeed
def check_deepspeed(path, pv):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    errors = []
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=pv["gpus"])
    try:
        deepspeed.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
        cfg = DeepSpeedConfig(path)
        expect(errors, "world size DeepSpeed counts", cfg.world_size, pv["gpus"])
        expect(errors, "train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu, pv["micro_batch"])
        expect(errors, "gradient_accumulation_steps", cfg.gradient_accumulation_steps, pv["accumulation"])
        # DeepSpeed counts every rank, AutoTP's too: its train batch is the plan's global batch x tp.
        expect(errors, "train_batch_size / tp", cfg.train_batch_size // max(1, pv["tp"]), pv["global_batch"])
        expect(errors, "zero_optimization.stage", cfg.zero_optimization_stage, pv["zero"])
        expect(errors, "bf16.enabled", bool(cfg.bfloat16_config.enabled), pv["precision"] in ("bf16", "fp8"))
        expect(errors, "fp16.enabled", bool(cfg.float16_config.enabled), pv["precision"] == "fp16")
        autotp = getattr(getattr(cfg, "tensor_parallel_config", None), "autotp_size", 0) or 1
        expect(errors, "tensor_parallel.autotp_size", autotp, pv["tp"])
        autoep = cfg.expert_parallel_config
        expect(errors, "expert_parallel.autoep_size", autoep.autoep_size if autoep.enabled else 1, pv["ep"])
        if autoep.enabled:  # the checks engine.py _configure_expert_parallel runs before it touches the model
            from deepspeed.module_inject.auto_ep_config import validate_autoep_config
            from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global

            validate_autoep_config(autoep, pv["gpus"], 1, autotp, 1)
            spec = build_folding_spec(world_size=pv["gpus"], pp_size=1, tp_size=autotp, ep_size=autoep.autoep_size,
                                      etp_size=autoep.expert_tensor_parallel_size, mp_mode="tp" if autotp > 1 else "sp")
            validate_folding_global(spec, zero_stage=cfg.zero_optimization_stage, sp_size=1, deepcompile_enabled=False,
                                    use_data_before_expert_parallel=cfg.use_data_before_expert_parallel_, mpu=None, autoep_enabled=True,
                                    tp_preset=getattr(cfg.tensor_parallel_config, "preset_model", None), ep_preset=autoep.preset_model,
                                    zero_offload_optimizer=cfg.zero_config.offload_optimizer is not None,
                                    zero_offload_param=cfg.zero_config.offload_param is not None)
    finally:
        dist.destroy_process_group()
    return errors


# ----------------------------------------------------------------------------------------------
# Accelerate
def check_accelerate(path, pv):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    errors = []
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "train.py")
        open(script, "w").write("pass\n")
        args = launch_command_parser().parse_args(["--config_file", path, script])
        args, defaults, mp_from_config_flag = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        world = int(args.num_processes)
        expect(errors, "num_processes", world, pv["gpus"])
        precision = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "fp8"}[pv["precision"]]
        expect(errors, "mixed_precision", env.get("ACCELERATE_MIXED_PRECISION", args.mixed_precision), precision)
        if env.get("ACCELERATE_USE_FSDP") == "true":
            import torch
            from accelerate.parallelism_config import ParallelismConfig
            from accelerate.utils import FullyShardedDataParallelPlugin

            # FSDP1 with sync_module_states (launch's default) asks for the device rank 0 broadcasts
            # from (only to build param_init_fn): on this CPU-only check, CUDA device 0.
            import accelerate.utils.dataclasses as accelerate_dataclasses

            saved_cuda = accelerate_dataclasses.is_cuda_available, torch.cuda.current_device
            accelerate_dataclasses.is_cuda_available, torch.cuda.current_device = (lambda: True), (lambda: 0)
            try:
                plugin = FullyShardedDataParallelPlugin()
            finally:
                accelerate_dataclasses.is_cuda_available, torch.cuda.current_device = saved_cuda
            # The FSDP version follows the stack the plan was made for: FSDP1 for fsdp1 and composer, else FSDP2.
            expect(errors, "fsdp_version", plugin.fsdp_version, 1 if pv["stack"] in ("fsdp1", "composer") else 2)
            if plugin.fsdp_version == 2:
                expect(errors, "fsdp_reshard_after_forward", bool(plugin.reshard_after_forward), pv["zero"] == 3)
            else:  # the ShardingStrategy the Accelerator hands FSDP1 (accelerator.py: sharding_strategy or
                # reshard_after_forward); HYBRID_* shards within a node, as FSDP1 builds its groups
                hybrid = 0 < pv["shard_group"] < pv["dp"]  # a ZeRO-3 plan's shard group
                want = {(3, False): "FULL_SHARD", (3, True): "HYBRID_SHARD", (2, False): "SHARD_GRAD_OP"}[(pv["zero"], hybrid and pv["zero"] == 3)]
                expect(errors, "FSDP1 sharding strategy", (plugin.sharding_strategy or plugin.reshard_after_forward).name, want)
                expect(errors, "limit_all_gathers", plugin.limit_all_gathers, True)
                expect(errors, "fsdp_backward_prefetch", getattr(plugin.backward_prefetch, "name", None), "BACKWARD_PRE" if pv["prefetch"] else None)
            # The gradients' reduction: in the dtype Accelerate's policy gives (set_mixed_precision, as
            # AcceleratorState calls it), or the plan's fp32 with a note that the script sets it.
            mp = env.get("ACCELERATE_MIXED_PRECISION", "no")
            if mp != "no":
                plugin.set_mixed_precision(mp)
            policy = plugin.mixed_precision_policy
            runs = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", None: None}[getattr(policy, "reduce_dtype", None)]
            runs = runs or ("fp32" if pv["precision"] == "fp32" else {"bf16": "bf16", "fp16": "fp16"}.get(pv["precision"]))
            if pv["reduce_dtype"] != runs:  # the script's policy, which the file's note must name
                torch_dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[pv["reduce_dtype"]]
                note = f"reduce_dtype={pv['reduce_dtype']}: predicted for a script that passes FullyShardedDataParallelPlugin(mixed_precision_policy="
                text = open(path).read()
                expect(errors, f"a note naming the script's policy (Accelerate reduces in {runs})",
                       note in text and f'"reduce_dtype": {torch_dtype}' in text, True)
            expect(errors, "fsdp_activation_checkpointing", bool(plugin.activation_checkpointing), pv["recompute"] != "none")
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false") == "true":
                pc = ParallelismConfig()  # from the environment, as the Accelerator builds it
                expect(errors, "parallelism total size", pc.total_size, pv["gpus"])
                expect(errors, "tp_size", pc.tp_size, pv["tp"])
                expect(errors, "cp_size", pc.cp_size, pv["cp"])
                expect(errors, "dp_replicate x dp_shard", pc.dp_replicate_size * pc.dp_shard_size, pv["dp"])
            else:  # no parallelism_config: FSDP shards over every process
                expect(errors, "FSDP over every process (no parallelism_config)", (pv["tp"], pv["cp"], pv["dp"]), (1, 1, pv["gpus"]))
        elif env.get("ACCELERATE_USE_DEEPSPEED") == "true":
            expect(errors, "ACCELERATE_DEEPSPEED_ZERO_STAGE", int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "-1")), pv["zero"])
            expect(errors, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", int(env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")), pv["accumulation"])
        else:
            expect(errors, "distributed type (DDP)", args.multi_gpu or world == 1, True)
            # DDP all-reduces the gradients in the parameters' dtype (fp32 beside autocast) unless
            # the script registers a communication hook, which the file's note must name.
            runs = "fp32" if pv["master_weights"] or pv["precision"] == "fp32" else pv["precision"]
            if world > 1 and pv["reduce_dtype"] != runs:
                hook = f"DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.{pv['reduce_dtype'].upper()})"
                expect(errors, f"a note naming the DDP communication hook (DDP reduces in {runs})", hook in open(path).read(), True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return errors


# ----------------------------------------------------------------------------------------------
# LitGPT
def check_litgpt(path, pv):
    import jsonargparse

    text = open(path).read()
    command = re.search(r"litgpt (pretrain|finetune_full|finetune_lora) --config", text).group(1)
    module = {"pretrain": "litgpt.pretrain", "finetune_full": "litgpt.finetune.full", "finetune_lora": "litgpt.finetune.lora"}[command]
    setup = importlib.import_module(module).setup
    # litgpt/__main__.py hands its recipes to jsonargparse.CLI, which builds each subcommand's
    # parser from the function's signature: the same parser, config read and classes instantiated.
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=jsonargparse.ActionConfigFile)
    parser.add_function_arguments(setup)
    init = parser.instantiate_classes(parser.parse_args(["--config", path]))
    errors = []
    devices, nodes = int(init.devices), int(init.num_nodes)
    world = devices * nodes
    expect(errors, "devices x num_nodes", world, pv["gpus"])
    train = init.train
    expect(errors, "train.micro_batch_size", train.micro_batch_size, pv["micro_batch"])
    expect(errors, "train.global_batch_size", train.global_batch_size, pv["global_batch"])
    expect(errors, "gradient_accumulation_iters", train.gradient_accumulation_iters(devices, nodes), pv["accumulation"])
    expect(errors, "train.max_seq_length", train.max_seq_length, pv["seq_len"])
    qlora_true = pv["mode"] == "qlora" and pv["precision"] == "bf16"  # LitGPT quantizes only without mixed precision
    precision = "bf16-true" if not pv["master_weights"] or qlora_true else {"bf16": "bf16-mixed", "fp32": "32-true"}.get(pv["precision"])
    expect(errors, "precision", init.precision, precision)
    if getattr(init, "quantize", None) is not None and "mixed" in init.precision:  # litgpt/finetune/lora.py setup() raises
        errors.append("quantize with a mixed precision: LitGPT raises 'Quantization and mixed precision is not supported.'")
    want_mode = {"pretrain": "pretrain", "finetune_full": "full", "finetune_lora": "lora"}[command]
    expect(errors, "recipe", want_mode, "lora" if pv["mode"] == "qlora" else pv["mode"])
    # The layout each recipe's setup() builds on world > 1 GPUs (see planner/src/export/export_litgpt.cpp).
    if world > 1:
        expect(errors, "zero stage (FSDP)", pv["zero"], 3)
        shard = pv["shard_group"] or pv["dp"]
        expect(errors, "FSDP shard group", shard, devices if command == "pretrain" else world)
        # The gradients' reduction: FSDPStrategy (pretrain, finetune_full) takes Lightning's
        # FSDPPrecision policy; finetune_lora's fully_shard gets none and reduces in the
        # parameters' dtype, fp32 unless the precision is "-true".
        import torch
        from lightning.fabric.plugins.precision.fsdp import FSDPPrecision

        if command == "finetune_lora":  # FSDP2 without a policy: the dtype Fabric builds the module in
            from lightning.fabric.plugins.precision import HalfPrecision, MixedPrecision, Precision

            plugin = {"bf16-true": lambda: HalfPrecision("bf16-true"), "bf16-mixed": lambda: MixedPrecision("bf16-mixed", "cuda"),
                      "32-true": Precision}[init.precision]()
            with plugin.module_init_context():
                reduce = torch.nn.Linear(1, 1).weight.dtype
        else:
            reduce = FSDPPrecision(init.precision).mixed_precision_config.reduce_dtype
        expect(errors, "FSDP reduce dtype", {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[reduce], pv["reduce_dtype"])
    expect(errors, "recompute", pv["recompute"], "full" if world > 1 and command != "pretrain" else "none")
    if command == "pretrain":
        from litgpt import Config

        config = init.model_config if isinstance(init.model_config, Config) else Config(**init.model_config)
        expect(errors, "model_config.block_size >= seq", config.block_size >= pv["seq_len"], True)
    elif command == "finetune_lora":
        expect(errors, "lora_r", init.lora_r, pv["lora_rank"])
        expect(errors, "quantize", init.quantize, "bnb.nf4" if pv["mode"] == "qlora" else None)
    return errors


# ----------------------------------------------------------------------------------------------
# Megatron
def megatron_argv(path):
    """Runs the export with a stand-in torchrun first on PATH; returns the arguments it got and
    the environment variables the script set or unset for it."""
    with tempfile.TemporaryDirectory() as scratch:
        record = os.path.join(scratch, "argv.json")
        stand_in = os.path.join(scratch, "torchrun")
        with open(stand_in, "w") as f:
            f.write(f"#!{sys.executable}\nimport json, os, sys\njson.dump([sys.argv[1:], dict(os.environ)], open({record!r}, 'w'))\n")
        os.chmod(stand_in, 0o755)
        env = dict(os.environ, PATH=scratch + os.pathsep + os.environ.get("PATH", ""))
        for variable in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):  # what the script sets is what it sets
            env.pop(variable, None)
        run = subprocess.run(["bash", os.path.abspath(path)], cwd=scratch, env=env, capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise RuntimeError(f"the script exited {run.returncode}: {run.stderr.strip()}")
        argv, seen = json.load(open(record))
    script = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    changed = {k: v for k, v in seen.items() if env.get(k) != v and k not in ("PATH", "NODE_RANK", "MASTER_ADDR")}
    changed.update({k: None for k in env if k not in seen})
    return argv[script + 1:], changed


def megatron_flags(args):
    flags, i = {}, 0
    while i < len(args):
        key = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[key] = args[i + 1]
            i += 2
        else:
            flags[key] = True
            i += 1
    return flags


def check_megatron(path, pv, megatron_lm=None):
    args, script_env = megatron_argv(path)
    f = megatron_flags(args)
    errors = []
    # PyTorch's allocator as the plan was priced: the variable 2.9 on reads, and the older one.
    for variable in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        expect(errors, variable + " the script sets", script_env.get(variable),
               "expandable_segments:True" if pv["allocator"] == "expandable-segments" else None)
    integer = lambda k, d=1: int(f.get(k, d))
    import torch
    import megatron.core.transformer.transformer_config as transformer_config_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    if importlib.util.find_spec("transformer_engine") is None:
        # Transformer Engine is a CUDA library, not installed on a CPU machine; the checks that ask
        # for its version (MoE with fp8) see one new enough, as on the cluster the export is for.
        transformer_config_module.is_te_min_version = lambda *a, **k: True

    layers = integer("num_layers")
    vpp = None
    if "num_virtual_stages_per_pipeline_rank" in f:
        vpp = integer("num_virtual_stages_per_pipeline_rank")
    elif "num_layers_per_virtual_pipeline_stage" in f:
        vpp = layers // (integer("pipeline_model_parallel_size") * integer("num_layers_per_virtual_pipeline_stage"))
    precision = torch.bfloat16 if "bf16" in f else torch.float16 if "fp16" in f else torch.float32
    config = TransformerConfig(
        num_layers=layers, hidden_size=integer("hidden_size"), num_attention_heads=integer("num_attention_heads"),
        num_query_groups=integer("num_query_groups", integer("num_attention_heads")) if "group_query_attention" in f else None,
        ffn_hidden_size=integer("ffn_hidden_size", 4 * integer("hidden_size")), kv_channels=None,
        tensor_model_parallel_size=integer("tensor_model_parallel_size"), pipeline_model_parallel_size=integer("pipeline_model_parallel_size"),
        virtual_pipeline_model_parallel_size=vpp, context_parallel_size=integer("context_parallel_size"),
        expert_model_parallel_size=integer("expert_model_parallel_size"), sequence_parallel="sequence_parallel" in f,
        num_moe_experts=int(f["num_experts"]) if "num_experts" in f else None, moe_router_topk=integer("moe_router_topk", 2),
        gated_linear_unit="swiglu" in f, add_bias_linear="disable_bias_linear" not in f, normalization=f.get("normalization", "LayerNorm"),
        recompute_granularity=f.get("recompute_granularity"), recompute_method=f.get("recompute_method"),
        recompute_num_layers=int(f["recompute_num_layers"]) if "recompute_num_layers" in f else None,
        bf16="bf16" in f, fp16="fp16" in f, params_dtype=precision, pipeline_dtype=precision,
        fp8=f.get("fp8_format"), fp8_recipe=f.get("fp8_recipe", "delayed"), account_for_embedding_in_pipeline_split="account_for_embedding_in_pipeline_split" in f,
        account_for_loss_in_pipeline_split="account_for_loss_in_pipeline_split" in f,
        num_layers_in_first_pipeline_stage=int(f["decoder_first_pipeline_num_layers"]) if "decoder_first_pipeline_num_layers" in f else None,
        num_layers_in_last_pipeline_stage=int(f["decoder_last_pipeline_num_layers"]) if "decoder_last_pipeline_num_layers" in f else None,
        cp_comm_type=f.get("cp_comm_type", "p2p"), pipeline_model_parallel_layout=f.get("pipeline_model_parallel_layout"),
    )
    if config.pipeline_model_parallel_layout is not None:
        # An uneven pipeline: Megatron-Core's own parser of the layout gives the model chunks per
        # rank (and TransformerConfig checked its layers against num_layers).
        detected = config.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size
        config.virtual_pipeline_model_parallel_size = detected if detected > 1 else None
    expect(errors, "tensor_model_parallel_size", config.tensor_model_parallel_size, pv["tp"])
    expect(errors, "pipeline_model_parallel_size", config.pipeline_model_parallel_size, pv["pp"])
    expect(errors, "context_parallel_size", config.context_parallel_size, pv["cp"])
    expect(errors, "expert_model_parallel_size", config.expert_model_parallel_size, pv["ep"])
    expect(errors, "sequence_parallel", config.sequence_parallel, bool(pv["sequence_parallel"]) and pv["tp"] > 1)
    want_vpp = pv["virtual_stages"] if pv["pp"] > 1 and pv["schedule"] == "interleaved" else None
    expect(errors, "virtual pipeline stages", config.virtual_pipeline_model_parallel_size, want_vpp)
    want_recompute = None if pv["recompute"] == "none" else pv["recompute"]
    expect(errors, "recompute_granularity", config.recompute_granularity, want_recompute)
    expect(errors, "bf16", config.bf16, pv["precision"] in ("bf16", "fp8"))
    expect(errors, "fp8", config.fp8 is not None, pv["precision"] == "fp8")
    if pv["precision"] == "fp8":  # current scaling is Megatron's tensorwise recipe; its default is delayed
        expect(errors, "fp8_recipe", config.fp8_recipe, "tensorwise" if pv["fp8_recipe"] == "current" else "delayed")
    # Megatron's batch arithmetic (validate_args): dp = world / (tp pp cp); global = mb x dp x accumulation.
    dp = pv["gpus"] // (config.tensor_model_parallel_size * config.pipeline_model_parallel_size * config.context_parallel_size)
    expect(errors, "data-parallel size", dp, pv["dp"])
    # The gradients' reduction dtype as Megatron-LM's validate_args settles it: --bf16 reduces in
    # fp32 unless --grad-reduce-in-bf16, --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32.
    if "bf16" in f:
        reduces = "bf16" if "grad_reduce_in_bf16" in f else "fp32"
    elif "fp16" in f:
        reduces = "fp32" if "accumulate_allreduce_grads_in_fp32" in f else "fp16"
    else:
        reduces = "fp32"
    expect(errors, "gradient reduction dtype", reduces, pv["reduce_dtype"])
    expect(errors, "micro_batch_size", integer("micro_batch_size"), pv["micro_batch"])
    expect(errors, "global_batch_size", integer("global_batch_size"), pv["global_batch"])
    if integer("global_batch_size") % (integer("micro_batch_size") * dp):
        errors.append(f"global batch {integer('global_batch_size')} is not a multiple of micro-batch x dp {integer('micro_batch_size') * dp}")
    if megatron_lm:
        errors += megatron_lm_validate(megatron_lm, args, script_env, pv)
    return errors


# The GPU generation validate_args asks torch.cuda for (8 Ampere, 9 Hopper, 10 Blackwell), from
# the plan's cluster: this machine has no GPU to ask.
def cluster_arch(cluster):
    name = json.dumps(cluster).lower()
    if any(k in name for k in ("b200", "b300", "gb200", "gb300")):
        return 10
    return 8 if any(k in name for k in ("a100", "p4d")) else 9


def megatron_lm_validate(checkout, args, script_env, pv):
    """Megatron-LM's parse_args and validate_args on the export's arguments, in a child process
    with the environment the script gave torchrun."""
    code = (
        "import sys, os, typing\n"
        # Megatron-LM imports typing.override (Python 3.12); typing_extensions has it for 3.11.
        "if not hasattr(typing, 'override'):\n"
        "    import typing_extensions; typing.override = typing_extensions.override\n"
        "import torch\n"
        "class Props:\n"
        f"    major, minor, name = {pv['arch']}, 0, 'stand-in'\n"
        "torch.cuda.get_device_properties = lambda *a, **k: Props()\n"
        "torch.cuda.get_device_capability = lambda *a, **k: (Props.major, 0)\n"
        f"sys.path.insert(0, {checkout!r})\n"
        "from megatron.training.arguments import parse_args, validate_args\n"
        f"sys.argv = ['pretrain_gpt.py'] + {args!r}\n"
        "a = parse_args()\n"
        "validate_args(a, {})\n"
        "print('MEGATRON', a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size, a.data_parallel_size, "
        "a.micro_batch_size, a.global_batch_size, a.virtual_pipeline_model_parallel_size, "
        "'fp32' if a.accumulate_allreduce_grads_in_fp32 else 'bf16' if a.bf16 else 'fp16' if a.fp16 else 'fp32')\n"
    )
    env = dict(os.environ, WORLD_SIZE=str(pv["gpus"]), RANK="0", LOCAL_RANK="0")
    for key, value in script_env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        return ["Megatron-LM validate_args: " + (run.stderr.strip().splitlines() or ["exit " + str(run.returncode)])[-1]]
    got = next(line for line in run.stdout.splitlines() if line.startswith("MEGATRON")).split()[1:]
    errors = []
    expect(errors, "Megatron-LM data_parallel_size", int(got[3]), pv["dp"])
    expect(errors, "Megatron-LM main-grad (reduction) dtype", got[7], pv["reduce_dtype"])
    return errors


CHECKS = {"torchtitan": check_torchtitan, "deepspeed": check_deepspeed, "accelerate": check_accelerate, "litgpt": check_litgpt,
          "megatron": check_megatron}


def check_one_stack(stack, jobs, megatron_lm):
    """In a child process per stack: every export of that stack, one after another."""
    results = []
    for job in jobs:
        try:
            pv = plan_values(json.load(open(job["plan"])))
            kwargs = {"megatron_lm": megatron_lm} if stack == "megatron" else {}
            errors = CHECKS[stack](job["export"], pv, **kwargs)
        except Exception as e:  # the stack refused the file: that is the finding, not a crash
            errors = [f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"]
        results.append({"name": job["name"], "errors": errors})
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--planner", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--stacks", default=",".join(STACKS))
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:  # stack:jobs.json
        stack, jobs_file = args.child.split(":", 1)
        os.environ.setdefault("LOCAL_RANK", "0")
        json.dump(check_one_stack(stack, json.load(open(jobs_file)), args.megatron_lm), sys.stdout)
        return 0

    stacks = [s for s in args.stacks.split(",") if s]
    missing = [s for s in stacks if importlib.util.find_spec(MODULES[s].split(".")[0]) is None]
    if missing:
        print(f"stack_parsers: not installed here: {', '.join(MODULES[s] for s in missing)} (scripts/setup.sh test installs "
              f"tests/export/requirements.txt)", file=sys.stderr)
        return 77
    os.makedirs(args.work, exist_ok=True)

    plans = {}
    for name, planner_args in MATRIX.items():
        out = os.path.join(args.work, name + ".plan.json")
        run = subprocess.run([args.planner] + shlex.split(planner_args) + ["--top", "1", "--save-plan", out], capture_output=True, text=True)
        if run.returncode != 0 or not os.path.exists(out):
            print(f"stack_parsers: the planner found no plan for {name} ({planner_args}):\n{run.stdout[-1500:]}{run.stderr}", file=sys.stderr)
            return 1
        plans[name] = out
    for path in PLAN_FILES:
        plans[os.path.basename(path).replace(".plan.json", "").replace(".json", "")] = path

    rows, jobs = [], {s: [] for s in stacks}
    for name, plan in plans.items():
        for stack in stacks:
            export = os.path.join(args.work, f"{name}.{stack}.{STACKS[stack]}")
            run = subprocess.run([args.planner, "export", plan, "--to", stack, "--out", export], capture_output=True, text=True, cwd=ROOT)
            if run.returncode == 0:
                jobs[stack].append({"name": name, "plan": plan, "export": export})
            else:
                message = " ".join(run.stderr.split())
                # A refusal (exit 2, no crash) names the stack and the setting it cannot express
                # ("deepspeed: pp=4: ..."), or says the plan is not a fixed one.
                ok = run.returncode == 2 and (re.search(rf"\b{stack}: [\w ,()]*\w=", message) is not None or "not fixed" in message)
                # "not exported yet": the stack could run it and the planner does not write it (yet).
                # A plan refused for several settings is a gap only if every one of them is.
                reasons = re.split(rf"; (?={stack}: )", message)
                result = "BAD REFUSAL" if not ok else "gap" if all("not exported yet" in r for r in reasons) else "refused"
                rows.append((name, stack, result, message.replace("planner: error: ", "")[:160]))

    failures = sum(1 for r in rows if r[2] == "BAD REFUSAL")
    accepted = 0
    for stack in stacks:
        if not jobs[stack]:
            continue
        jobs_file = os.path.join(args.work, stack + ".jobs.json")
        json.dump(jobs[stack], open(jobs_file, "w"))
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--planner", args.planner, "--work", args.work, "--child",
                              f"{stack}:{jobs_file}"] + (["--megatron-lm", args.megatron_lm] if args.megatron_lm else []),
                             capture_output=True, text=True, timeout=1800, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if run.returncode != 0:
            print(f"stack_parsers: the {stack} checker crashed:\n{run.stderr[-3000:]}", file=sys.stderr)
            return 1
        for r in json.loads(run.stdout.strip().splitlines()[-1]):
            if r["errors"]:
                failures += 1
                rows.append((r["name"], stack, "REJECTED", "; ".join(r["errors"])[:300]))
            else:
                accepted += 1
                rows.append((r["name"], stack, "accepted", "the plan's degrees, batch, schedule, recompute and precision"))

    rows.sort()
    width = max(len(r[0]) for r in rows)
    print(f"{'plan':<{width}}  {'stack':<10}  {'result':<11}  detail")
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:<10}  {r[2]:<11}  {r[3]}")
    written = sum(len(j) for j in jobs.values())
    gaps = sum(1 for r in rows if r[2] == "gap")
    print(f"\n{len(plans)} plans x {len(stacks)} stacks: {written} exports written, {accepted} accepted by their stack's parser; "
          f"{len(rows) - written} refused by the planner ({gaps} of them settings the stack has and the export does not write yet); {failures} failures"
          + ("" if not args.megatron_lm else f"; Megatron-LM checkout {args.megatron_lm}"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
