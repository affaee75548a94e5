#!/usr/bin/env python3
"""torchtitan v0.2.2's own trainer on a `planner export --to torchtitan` file, on random tokens.

    torchrun --standalone --nproc-per-node 1 bench/torchtitan_train.py --job.config_file RUN.toml \\
        --training.steps 8 --metrics.log_freq 1 [other torchtitan flags]

What this adds to `python -m torchtitan.train`, and nothing else:
  * the model flavor the export asks the user to register (its comment line
    `# llama3_args["NAME"] = TransformerModelArgs(dim=..., ...)`), registered with that line's numbers;
  * uniform random tokens in place of torchtitan's C4 loader and tokenizer: the GPU machine reaches
    no dataset, and a dense model's step does the same work on any tokens. torchtitan's loader
    module imports `datasets`; where it is not installed, a stand-in that refuses to load anything
    takes its place (the random loader never calls it);
  * KERNELS=PATH: the last step runs under torch.profiler (CUDA activity only) and its kernels are
    summed by name into a CSV (kernel, calls, device_us); that step is not logged, so every step
    line of the log is an unprofiled step.
The log lines are torchtitan's own: `planner compare PLAN LOG` reads them.
"""
import importlib
import os
import re
import sys
import types

import torch


def stand_in_datasets():
    try:
        import datasets  # noqa: F401
        return
    except ImportError:
        pass

    def refuse(*args, **kwargs):
        raise RuntimeError("bench/torchtitan_train.py: `datasets` is not installed here; this run trains on random tokens")

    ds = types.ModuleType("datasets")
    ds.Dataset = type("Dataset", (), {})
    ds.load_dataset = refuse
    dist = types.ModuleType("datasets.distributed")
    dist.split_dataset_by_node = refuse
    ds.distributed = dist
    sys.modules["datasets"] = ds
    sys.modules["datasets.distributed"] = dist


def config_path(argv):
    for i, arg in enumerate(argv):
        if arg.startswith("--job.config_file=") or arg.startswith("--job.config-file="):
            return arg.split("=", 1)[1]
        if arg in ("--job.config_file", "--job.config-file") and i + 1 < len(argv):
            return argv[i + 1]
    sys.exit("bench/torchtitan_train.py: --job.config_file RUN.toml is required (a `planner export --to torchtitan` file)")


def register_flavor(path):
    """The export's `# llama3_args["NAME"] = TransformerModelArgs(k=v, ...)` line, if it has one."""
    pattern = re.compile(r'^#\s+(\w+)_args\["((?:[^"\\]|\\.)*)"\] = (\w+)\((.*)\)\s*$')
    with open(path) as f:
        for line in f:
            m = pattern.match(line)
            if not m:
                continue
            family, name, cls_name, args = m.group(1), m.group(2), m.group(3), m.group(4)
            kwargs = {}
            for key, value in re.findall(r"(\w+)=([-+0-9.eE]+)", args):
                kwargs[key] = int(value) if re.fullmatch(r"[-+]?[0-9]+", value) else float(value)
            module = importlib.import_module("torchtitan.models." + family)
            getattr(module, family + "_args")[name] = getattr(module, cls_name)(**kwargs)
            print(f"torchtitan_train: registered flavor {name!r}: {cls_name}({kwargs})", flush=True)


class RandomTokens:
    """(input_dict, labels) batches of uniform random token ids, as torchtitan's loaders yield them."""

    def __init__(self, batch, seq_len, vocab, seed):
        self.batch, self.seq_len, self.vocab = batch, seq_len, vocab
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        while True:
            tokens = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1), generator=self.generator)
            yield {"input": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def use_random_tokens(job_model_name):
    import dataclasses
    from torchtitan.protocols import train_spec as ts

    spec = ts.get_train_spec(job_model_name)

    def build(dp_world_size, dp_rank, tokenizer, job_config, **kwargs):
        vocab = spec.model_args[job_config.model.flavor].vocab_size
        return RandomTokens(job_config.training.local_batch_size, job_config.training.seq_len, vocab, seed=1234 + dp_rank)

    ts.register_train_spec(job_model_name, dataclasses.replace(spec, build_dataloader_fn=build, build_tokenizer_fn=None))


def model_name(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f).get("model", {}).get("name", "llama3")


def main():
    argv = sys.argv[1:]
    path = config_path(argv)
    stand_in_datasets()
    register_flavor(path)
    use_random_tokens(model_name(path))

    from torchtitan.train import Trainer, main as titan_main

    kernels = os.environ.get("KERNELS")

    class Trainer_(Trainer):
        def train_step(self, data_iterator):
            if not kernels or self.step != self.job_config.training.steps:
                return super().train_step(data_iterator)
            from kernel_csv import profile_step
            self.metrics_processor.should_log = lambda step: False
            launches, names, busy = profile_step(lambda: super(Trainer_, self).train_step(data_iterator), kernels)
            print(f"torchtitan_train: step {self.step} profiled: {launches} launches of {names} kernels, {busy:.1f} ms busy -> {kernels}",
                  flush=True)

    titan_main(Trainer_)


if __name__ == "__main__":
    main()
