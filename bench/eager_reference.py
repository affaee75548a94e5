#!/usr/bin/env python3
"""The executor's model and training step written in plain PyTorch eager Python, for speed.

The same decoder as executor/src/model/model.cpp (Llama: RMSNorm, rotary "rotate half", SwiGLU, grouped
query attention through scaled_dot_product_attention; GPT: LayerNorm, learned positions, GELU),
built from the same trainplan/model/v1 document, trained the same way: micro-batches accumulated
into one optimizer step, the loss in float32, the gradient clipped by its global norm, AdamW with
the executor's warmup and cosine schedule. With bf16 the model computes in bf16 and the optimizer
keeps float32 master weights, as the executor does. Batches have the executor's shape but are
uniform random tokens (the executor's synthetic tokens have a learnable bigram structure, so the
losses differ; the work per step does not). bench/eager_bench.sh runs this beside the executor
on the same plan and compares them.

  eager_reference.py --model MODEL.json --seq-len S --micro-batch B --global-batch G
                     --precision fp32|bf16 --steps N --device cpu|cuda [--threads T] --out FILE.json
                     [--compile] [--impl trainplan|hf]

--compile wraps the model in torch.compile (Inductor: fused element-wise kernels around the same
GEMMs and attention). --impl hf trains Hugging Face transformers' LlamaForCausalLM built from the
same document instead of the model below (Llama-architecture documents only; needs transformers),
the peer most users start from. Writes {"tokens_per_second", "step_seconds" (median of steps
2..N), "peak_memory_bytes" (CUDA allocator peak allocated; null on CPU), "peak_reserved_bytes"
(the allocator's peak reserved), "parameters", "losses"} to --out. Numbers, not a test: the
executor must be at least as fast as the best of these (issues 3 and 12).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

ROPE_THETA = 10000.0  # executor/src/model/model.cpp kRopeTheta
NORM_EPS = 1e-5


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.gpt = m["architecture"] == "gpt"
        h, heads = m["hidden"], m["heads"]
        self.heads, self.kv_heads, self.head_dim = heads, m.get("kv_heads", heads), h // heads
        kv = self.kv_heads * self.head_dim
        norm = (lambda: nn.LayerNorm(h, eps=NORM_EPS)) if self.gpt else (lambda: nn.RMSNorm(h, eps=NORM_EPS))
        self.norm1, self.norm2 = norm(), norm()
        self.wq = nn.Linear(h, h, bias=self.gpt)
        self.wk = nn.Linear(h, kv, bias=self.gpt)
        self.wv = nn.Linear(h, kv, bias=self.gpt)
        self.wo = nn.Linear(h, h, bias=self.gpt)
        f = m["ffn_hidden"]
        if self.gpt:
            self.fc1, self.fc2 = nn.Linear(h, f), nn.Linear(f, h)
        else:
            self.gate, self.up, self.down = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        a = self.norm1(x)
        q = self.wq(a).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(a).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(a).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if not self.gpt:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        h1 = x + self.wo(attn.transpose(1, 2).reshape(b, s, -1))
        c = self.norm2(h1)
        mlp = self.fc2(F.gelu(self.fc1(c), approximate="tanh")) if self.gpt else self.down(F.silu(self.gate(c)) * self.up(c))
        return h1 + mlp


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Decoder(nn.Module):
    def __init__(self, m, seq_len):
        super().__init__()
        self.gpt = m["architecture"] == "gpt"
        h = m["hidden"]
        self.embedding = nn.Embedding(m["vocab"], h)
        self.positions = nn.Embedding(m["max_seq_len"], h) if self.gpt else None
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.norm = nn.LayerNorm(h, eps=NORM_EPS) if self.gpt else nn.RMSNorm(h, eps=NORM_EPS)
        self.head = None if m.get("tied_embeddings", False) else nn.Linear(h, m["vocab"], bias=False)
        d = h // m["heads"]
        inv = ROPE_THETA ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        both = torch.cat((angles, angles), -1)
        self.register_buffer("cos", both.cos(), persistent=False)
        self.register_buffer("sin", both.sin(), persistent=False)

    def forward(self, tokens, targets):
        x = self.embedding(tokens)
        if self.gpt:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device)).unsqueeze(0)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        weight = self.embedding.weight if self.head is None else self.head.weight
        logits = F.linear(self.norm(x), weight)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def hf_llama(m, seq_len):
    """transformers' LlamaForCausalLM with the document's shape and the executor's rotary base and
    norm epsilon; no biases, as executor/src/model/model.cpp."""
    from transformers import LlamaConfig, LlamaForCausalLM  # ImportError: the caller skips this peer

    config = LlamaConfig(vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn_hidden"],
                         num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
                         num_key_value_heads=m.get("kv_heads", m["heads"]), max_position_embeddings=max(seq_len, m.get("max_seq_len", seq_len)),
                         rms_norm_eps=NORM_EPS, rope_theta=ROPE_THETA, tie_word_embeddings=m.get("tied_embeddings", False),
                         attention_bias=False, mlp_bias=False, use_cache=False)
    config._attn_implementation = "sdpa"
    inner = LlamaForCausalLM(config)

    class HfDecoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, tokens, targets):
            logits = self.inner(input_ids=tokens, use_cache=False).logits
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    return HfDecoder()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="trainplan/model/v1 document")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--out", required=True)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor)")
    p.add_argument("--float8", action="store_true",
                   help="torchao's float8 training (convert_to_float8_training, the tensorwise recipe) on the blocks' linear "
                        "layers, the output layer left in bf16 as torchtitan filters it; needs torchao and --precision bf16")
    p.add_argument("--impl", choices=["trainplan", "hf"], default="trainplan",
                   help="trainplan: the model below; hf: transformers' LlamaForCausalLM of the same shape")
    a = p.parse_args()
    if a.global_batch % a.micro_batch != 0 or a.steps < 2:
        sys.exit("eager_reference: --global-batch must be a multiple of --micro-batch and --steps at least 2")
    with open(a.model) as f:
        m = json.load(f)
    if a.float8 and a.precision != "bf16":
        sys.exit("eager_reference: --float8 trains bf16 modules with fp8 GEMMs: give --precision bf16")
    if a.impl == "hf" and m["architecture"] != "llama":
        sys.exit("eager_reference: --impl hf builds LlamaForCausalLM; the model is " + m["architecture"])
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    torch.manual_seed(1234)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model = (hf_llama(m, a.seq_len) if a.impl == "hf" else Decoder(m, a.seq_len)).to(device)
    for name, w in model.named_parameters():  # the executor's init: N(0, 0.02), norms 1, biases 0
        if w.dim() > 1:
            nn.init.normal_(w, std=0.02)
    masters = [w.detach().clone().float() for w in model.parameters()]
    model = model.to(dtype)
    if a.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # ImportError: the caller skips this peer

        # Float8Linear keeps each nn.Linear's weight Parameter, so the masters still pair with them.
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda mod, fqn: not fqn.endswith(("head", "lm_head")))
    params = list(model.parameters())
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(masters if dtype != torch.float32 else params, lr=a.lr, weight_decay=0.1, fused=fused)
    if dtype == torch.float32:
        masters = params
    step_model = torch.compile(model) if a.compile else model
    micro_batches = a.global_batch // a.micro_batch
    gen = torch.Generator(device=device).manual_seed(1)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for step in range(1, a.steps + 1):
        synchronize()
        start = time.perf_counter()
        total = 0.0
        for _ in range(micro_batches):
            tokens = torch.randint(0, m["vocab"], (a.micro_batch, a.seq_len + 1), device=device, generator=gen)
            loss = step_model(tokens[:, :-1], tokens[:, 1:]) / micro_batches
            loss.backward()
            total += loss.detach()
        if dtype != torch.float32:
            for w, master in zip(params, masters):
                master.grad = w.grad.float()
        torch.nn.utils.clip_grad_norm_(masters, 1.0, foreach=True)
        warmup = max(1, a.steps // 10)  # the executor's schedule: linear warmup, cosine to 10%
        progress = min(1.0, max(0.0, (step - warmup) / max(1, a.steps - warmup)))
        for g in optimizer.param_groups:
            g["lr"] = a.lr * (step / warmup if step <= warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dtype != torch.float32:
            with torch.no_grad():
                torch._foreach_copy_(params, masters)
            for w in params:
                w.grad = None
        losses.append(float(total))  # synchronises, as the executor's per-step loss does
        synchronize()
        times.append(time.perf_counter() - start)
        print(f"eager step {step:5d}/{a.steps} | loss {losses[-1]:9.5f} | {a.global_batch * a.seq_len / times[-1]:12.0f} tok/s | {times[-1]:8.3f} s",
              flush=True)
    step_seconds = statistics.median(times[1:])
    kind = ("transformers LlamaForCausalLM" if a.impl == "hf" else "the executor's model") + (", torch.compile" if a.compile else ", eager")
    if a.float8:
        import torchao

        kind += f", torchao {torchao.__version__} float8 tensorwise"
    out = {
        "source": f"bench/eager_reference.py ({kind}; PyTorch {torch.__version__})",
        "impl": a.impl, "compile": a.compile, "float8": a.float8,
        "device": a.device, "precision": a.precision, "parameters": sum(w.numel() for w in params),
        "step_seconds": step_seconds, "tokens_per_second": a.global_batch * a.seq_len / step_seconds,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        "losses": losses,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
