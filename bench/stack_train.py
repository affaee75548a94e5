#!/usr/bin/env python3
"""The training script that `planner export --to deepspeed` and `--to accelerate` leave to the user,
for timing the exports on a GPU: a Hugging Face Llama of a trainplan model's shape, random tokens,
and each stack's own training loop, configured by the exported file alone.

    torchrun --standalone --nproc-per-node N bench/stack_train.py --stack deepspeed --deepspeed_config DS.json \\
        --model MODEL.json --seq-len S --steps K --out RUN.json
    accelerate launch --config_file ACC.yaml bench/stack_train.py --stack accelerate --micro-batch M \\
        --global-batch G --model MODEL.json --seq-len S --steps K --out RUN.json

DeepSpeed takes the micro-batch and the accumulation from its JSON (train_micro_batch_size_per_gpu,
gradient_accumulation_steps); Accelerate's YAML holds neither (the export's header names them), so
they are flags here. The model: transformers' LlamaForCausalLM with the trainplan model's sizes,
SDPA attention, its own loss (bf16 logits cast to float32 for the cross-entropy), built inside
deepspeed.zero.Init for ZeRO-3 as Hugging Face's integration does. The optimizer: AdamW with the
export's hyper-parameters (DeepSpeed builds its own from the JSON: FusedAdam); Accelerate's is
torch.optim.AdamW (fused=True; the pytorch-eager stack prices a fused step).

RUN.json: every step's wall time (CUDA synchronised), its loss, the peak memory PyTorch's
allocator saw (max_memory_allocated and max_memory_reserved over the whole run, bytes), and the
versions. The first WARMUP steps (default 2) are timed but not in the median. KERNELS=PATH: one more
step after the timed ones runs under torch.profiler, its kernels summed into a CSV (bench/kernel_csv.py)."""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def hf_config(doc, seq_len):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=doc["vocab"], hidden_size=doc["hidden"], intermediate_size=doc["ffn_hidden"],
                       num_hidden_layers=doc["layers"], num_attention_heads=doc["heads"],
                       num_key_value_heads=doc.get("kv_heads", doc["heads"]),
                       max_position_embeddings=max(seq_len, doc.get("max_seq_len", seq_len)),
                       tie_word_embeddings=bool(doc.get("tied_embeddings", False)), attn_implementation="sdpa",
                       use_cache=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", choices=["deepspeed", "accelerate"], required=True)
    ap.add_argument("--model", required=True, help="trainplan model JSON (trainplan/model/v1)")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, help="accelerate: sequences per GPU per micro-batch")
    ap.add_argument("--global-batch", type=int, help="accelerate: sequences per optimizer step, all GPUs")
    ap.add_argument("--deepspeed_config", help="deepspeed: the exported JSON")
    ap.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.steps <= a.warmup:
        sys.exit(f"stack_train: --steps {a.steps} must exceed --warmup {a.warmup}")
    with open(a.model) as f:
        doc = json.load(f)
    from transformers import LlamaForCausalLM
    import transformers

    config = hf_config(doc, a.seq_len)
    local_rank = int(os.environ.get("LOCAL_RANK", a.local_rank))
    torch.cuda.set_device(local_rank)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    generator = torch.Generator().manual_seed(1234 + local_rank)

    if a.stack == "deepspeed":
        if not a.deepspeed_config:
            sys.exit("stack_train: --stack deepspeed needs --deepspeed_config (the exported JSON)")
        import deepspeed
        versions["deepspeed"] = deepspeed.__version__
        with open(a.deepspeed_config) as f:
            ds = json.load(f)
        deepspeed.init_distributed()
        stage = ds.get("zero_optimization", {}).get("stage", 0)
        with deepspeed.zero.Init(config_dict_or_path=ds, enabled=stage == 3):
            model = LlamaForCausalLM(config)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
        micro, accumulation = ds["train_micro_batch_size_per_gpu"], ds.get("gradient_accumulation_steps", 1)

        def step(batches):
            losses = []
            for tokens in batches:
                loss = engine(input_ids=tokens, labels=tokens).loss
                engine.backward(loss)
                engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary only
                losses.append(loss.detach())
            return torch.stack(losses).mean()
    else:
        if not (a.micro_batch and a.global_batch):
            sys.exit("stack_train: --stack accelerate needs --micro-batch and --global-batch (the export's header gives them)")
        import accelerate
        from accelerate import Accelerator
        versions["accelerate"] = accelerate.__version__
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if a.global_batch % (a.micro_batch * world):
            sys.exit(f"stack_train: global batch {a.global_batch} is not a multiple of micro-batch {a.micro_batch} x {world} processes")
        micro, accumulation = a.micro_batch, a.global_batch // (a.micro_batch * world)
        accelerator = Accelerator(gradient_accumulation_steps=accumulation)
        with torch.device(accelerator.device):
            model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        versions["mixed_precision"] = str(accelerator.mixed_precision)
        versions["distributed_type"] = str(accelerator.distributed_type)

        def step(batches):
            losses = []
            for tokens in batches:
                with accelerator.accumulate(model):
                    loss = model(input_ids=tokens, labels=tokens).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
            return torch.stack(losses).mean()

    device = torch.device("cuda", local_rank)
    times, losses = [], []
    for k in range(a.steps):
        batches = [torch.randint(0, doc["vocab"], (micro, a.seq_len), generator=generator).to(device) for _ in range(accumulation)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(batches)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        print(f"stack_train: {a.stack} step {k + 1}/{a.steps}: {times[-1]:.4f} s, loss {losses[-1]:.4f}, "
              f"peak reserved {torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB", flush=True)
    kernels = os.environ.get("KERNELS")
    if kernels:  # one more step, after the timed ones, under the profiler
        from kernel_csv import profile_step
        batches = [torch.randint(0, doc["vocab"], (micro, a.seq_len), generator=generator).to(device) for _ in range(accumulation)]
        launches, names, busy = profile_step(lambda: step(batches), kernels)
        print(f"stack_train: one more step profiled: {launches} launches of {names} kernels, {busy:.1f} ms busy -> {kernels}", flush=True)
    steady = times[a.warmup:]
    median = statistics.median(steady)
    tokens = micro * accumulation * a.seq_len * int(os.environ.get("WORLD_SIZE", "1"))
    result = {
        "schema": "trainplan/bench/stack-run/v1",
        "stack": a.stack, "command": " ".join(sys.argv), "config": a.deepspeed_config,
        "model": doc, "seq_len": a.seq_len, "micro_batch": micro, "gradient_accumulation": accumulation,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")), "gpu": torch.cuda.get_device_name(device),
        "versions": versions, "warmup_steps": a.warmup, "step_seconds": times, "losses": losses,
        "median_step_seconds": median, "tokens_per_second_per_gpu": tokens / median / int(os.environ.get("WORLD_SIZE", "1")),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }
    if local_rank == 0:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"stack_train: {a.stack}: median step {median:.4f} s, {result['tokens_per_second_per_gpu']:.0f} tokens/s per GPU, "
              f"peak allocated {result['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved {result['peak_reserved_bytes'] / 2**30:.2f} GiB -> {a.out}")


if __name__ == "__main__":
    main()
