"""One training step under torch.profiler (CUDA activity only), its kernels summed by name into a CSV
(kernel, calls, device_us), for bench/torchtitan_train.py and bench/stack_train.py."""
import csv

import torch


def profile_step(run_step, path):
    """Runs run_step() under the profiler, writes the CSV at path (busiest kernel first) and returns
    (launches, distinct kernel names, busy milliseconds)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = e.device_time_total
        calls, total = rows.get(e.name, (0, 0.0))
        rows[e.name] = (calls + 1, total + us)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "calls", "device_us"])
        for name, (calls, us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            w.writerow([name, calls, f"{us:.1f}"])
    return sum(calls for calls, _ in rows.values()), len(rows), sum(us for _, us in rows.values()) / 1e3
