#!/usr/bin/env python3
"""Host time of DeepSpeed ZeRO-3's Python loops over the ranks of its data-parallel group.

DeepSpeed v0.16.5 (microsoft/DeepSpeed 38327e07) runs two loops over every rank of the group
for every parameter tensor, on the thread that also launches the model's kernels:

  * gathering (runtime/zero/partition_parameters.py, _all_gather_dtype and
    AllGatherCoalescedHandle.wait): a view of the flat all-gather buffer per rank, then for each
    parameter a view of its slice in each rank's partition, concatenated into the parameter
    (torch.cat of `ranks` views) - plus record_stream on each view, which needs CUDA and is not
    timed here;
  * reducing (runtime/comm/coalesced_collectives.py, reduce_scatter_coalesced): a slice of each
    gradient per rank, the slices interleaved rank-major into one list, torch.cat of that list,
    the pre-divide, torch.chunk into `ranks` pieces.

DeepSpeed v0.3.16 (April 2021, the ZeRO-3 of its ZeRO-Infinity release; the `deepspeed-v0.3`
stack) gathered each parameter on its own (runtime/zero/partition_parameters.py,
_allgather_param): a zeroed flat buffer, then a Python loop over the ranks that takes a view
(narrow) of each rank's partition and asks torch.distributed.get_rank(group) at every rank, the
views handed to torch.distributed.all_gather as its output list. What the list costs inside
ProcessGroupNCCL (a copy per rank, launched from C++) needs CUDA and is charged in the cost model
as one launch per rank; the loop before it is timed here as `gather03`.

This script runs the same loops (rewritten here, not DeepSpeed's code) on small CPU tensors, so
the copies are negligible and what is timed is the interpreter and ATen's dispatch: the host
time per rank per tensor. The cost model charges it per gathered and per reduced tensor
(costmodel/src/compute/stack.cpp, kDeepspeed). It needs only torch:

  python3 bench/deepspeed_host_loops.py            # prints the table recorded in bench/results.md
"""
import math
import platform
import tempfile
import time

import torch
import torch.distributed as dist


def gather(numels, ranks):
    # _all_gather_dtype: one view per rank of the flat buffer; wait(): per parameter, its slice
    # of every rank's partition, then one torch.cat into the parameter.
    partition = sum(math.ceil(n / ranks) for n in numels)
    flat = torch.empty(partition * ranks, dtype=torch.bfloat16)
    partitions = [flat.narrow(0, partition * r, partition) for r in range(ranks)]
    offset = 0
    for n in numels:
        shard = math.ceil(n / ranks)
        pieces = []
        for r in range(ranks):
            start = r * shard
            if start < n:
                pieces.append(partitions[r].narrow(0, offset, min(n - start, shard)))
        torch.cat(pieces).view(-1)
        offset += shard


def reduce(grads, ranks):
    # reduce_scatter_coalesced: each gradient sliced per rank, the slices interleaved rank-major
    # (padding where a slice is short), one torch.cat, the pre-divide, torch.chunk per rank.
    slices = []
    for g in grads:
        flat = g.view(-1)
        chunk = math.ceil(g.numel() / ranks)
        slices.append([flat[r * chunk:r * chunk + chunk] for r in range(ranks)])
    padded = tuple(math.ceil(g.numel() / ranks) for g in grads)
    interleaved = []
    for r in range(ranks):
        for i in range(len(grads)):
            piece = slices[i][r]
            interleaved.append(piece)
            if padded[i] - piece.numel() > 0:
                interleaved.append(torch.empty(padded[i] - piece.numel(), dtype=piece.dtype))
    buffer = torch.cat(interleaved)
    buffer.div_(ranks)
    torch.chunk(buffer, ranks)


def gather_v03(numel, ranks):
    # _allgather_param: torch.zeros of the aligned size, one narrow per rank appended to the list,
    # get_rank(group) compared at each rank, the own partition copied in.
    partition = math.ceil(numel / ranks)
    shard = torch.empty(partition, dtype=torch.bfloat16)
    flat = torch.zeros(partition * ranks, dtype=torch.bfloat16).view(-1)
    partitions = []
    for i in range(ranks):
        partitions.append(flat.narrow(0, partition * i, partition))
        if i == dist.get_rank(group=dist.group.WORLD):
            partitions[i].data.copy_(shard.data, non_blocking=True)
    flat.narrow(0, 0, numel).view(numel)


def best_of(fn, repeats=15):
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    torch.set_num_threads(1)
    # A one-rank gloo group, so that get_rank(group) runs the lookup it runs in a real job.
    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1)
        try:
            run_loops()
        finally:
            dist.destroy_process_group()


def run_loops():
    print(f"# torch {torch.__version__}, Python {platform.python_version()}, {platform.processor() or platform.machine()}")
    print(f"{'loop':8s} {'ranks':>6s} {'tensors':>8s} {'ms':>9s} {'us per rank per tensor':>24s}")
    for ranks in (256, 1024, 4096):
        for tensors in (1, 7):
            # 4 elements per rank: the copies are negligible beside the loops.
            numels = [4 * ranks - 3] * tensors
            grads = [torch.empty(n, dtype=torch.bfloat16) for n in numels]
            for name, fn in (("gather", lambda: gather(numels, ranks)), ("reduce", lambda: reduce(grads, ranks))):
                seconds = best_of(fn)
                print(f"{name:8s} {ranks:6d} {tensors:8d} {seconds * 1e3:9.3f} {seconds / (ranks * tensors) * 1e6:24.2f}")
        # v0.3.16: one parameter per call.
        seconds = best_of(lambda: gather_v03(4 * ranks - 3, ranks))
        print(f"{'gather03':8s} {ranks:6d} {1:8d} {seconds * 1e3:9.3f} {seconds / ranks * 1e6:24.2f}")


if __name__ == "__main__":
    main()
