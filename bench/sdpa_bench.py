#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on this GPU, backend by backend, at the shapes of the
bench/stacks runs (Llama 3 8B attention: 32 query heads, 8 key/value heads, head size 128, bf16,
causal): forward, and forward + backward, milliseconds and TFLOP/s.

    python3 bench/sdpa_bench.py OUT.json

Backends: what SDPA picks unasked ("default"), cuDNN, FlashAttention-2 (ATen's flash kernels) and
memory-efficient. GQA as torchtitan and transformers ask for it (enable_gqa=True); a backend that
refuses it gets the key/value heads repeated (what it would be handed otherwise), said in the row.
FLOPs: the causal half of 4 b h s^2 d forward (two GEMMs) and 2.5 times that backward (five), the
FlashAttention papers' convention. Each figure: the median of 10 timed calls after 3 warm-ups
(CUDA events)."""
import contextlib
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps=10, warmup=3):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    heads, kv_heads, d = 32, 8, 128
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []
    for seq, batch in ((8192, 2), (32768, 1)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        k = torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        v = torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        flops_fwd = 4 * batch * heads * seq * seq * d / 2
        for name, backend in backends.items():
            row = {"backend": name, "seq_len": seq, "batch": batch, "heads": heads, "kv_heads": kv_heads, "head_dim": d}
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1))
                def fwd():
                    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)

                try:
                    out = fwd()
                    grad = torch.randn_like(out)

                    def fwd_bwd():
                        o = fwd()
                        torch.autograd.grad(o, (q, kk, vv), grad)

                    row["gqa"] = "native" if gqa else "repeated key/value heads"
                    row["forward_ms"] = timed(fwd)
                    row["forward_backward_ms"] = timed(fwd_bwd)
                    row["forward_tflops"] = flops_fwd / row["forward_ms"] / 1e9
                    row["forward_backward_tflops"] = 3.5 * flops_fwd / row["forward_backward_ms"] / 1e9
                    break
                except RuntimeError as e:
                    row["refused_" + ("gqa" if gqa else "repeated")] = str(e).splitlines()[0][:200]
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {"schema": "trainplan/bench/sdpa/v1", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "command": " ".join(sys.argv), "rows": rows}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
