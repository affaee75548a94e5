#!/usr/bin/env python3
"""Logits of a Hugging Face Llama checkpoint computed by transformers itself, against the
executor's (issue 15: the test's reference, and proof that transformers loads what the executor
exports).

    hf_transformers_logits.py CHECKPOINT_DIR LOGITS_FILE

LOGITS_FILE (safetensors, written by tests/executor/hf_lora_test.cpp): "tokens" (int64 [b, s])
and "logits" (float32 [b, s, vocab], the executor's). Loads CHECKPOINT_DIR with
LlamaForCausalLM.from_pretrained in float32, runs the tokens, prints
"max relative difference X" (the largest absolute difference over the largest logit).
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    checkpoint, logits_file = sys.argv[1], sys.argv[2]
    data = load_file(logits_file)
    model = LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        reference = model(input_ids=data["tokens"]).logits.double()
    difference = (data["logits"].double() - reference).abs().max() / reference.abs().max()
    print(f"max relative difference {difference.item():.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
