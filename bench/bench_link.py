# Run: PYTHONPATH=. python bench/bench_link.py [--backend gloo|nccl]   (repository root; ~5 s)
"""The link between two pipeline ranks on this machine: latency and bandwidth of one message.

Two processes (one thread each, as ``autopipe run`` starts its ranks) ping-pong tensors of
4 B to 8 MiB with ``torch.distributed`` send/recv, many times each; one-way time is half the
median round trip. A least-squares line ``t = latency + bytes / bandwidth`` through the sizes
gives the two numbers the planner takes (``--latency``, ``--bandwidth``;
``autopipe.planner.defaults.default_link`` quotes this script's figures for CPU ranks over gloo).
NCCL needs two GPUs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
SIZES = (4, 4096, 65536, 1 << 20, 4 << 20, 8 << 20)
ROUNDS, WARMUP = 60, 10


def worker(backend: str) -> None:
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rows = []
    for nbytes in SIZES:
        t = torch.zeros(nbytes // 4, device=device)
        times = []
        for _ in range(ROUNDS):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        rows.append((nbytes, statistics.median(times[WARMUP:]) / 2))
    if rank == 0:
        xs, ys = [float(b) for b, _ in rows], [t for _, t in rows]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        latency = my - slope * mx
        for nbytes, t in rows:
            print(f"{nbytes:>9} B  one-way {t * 1e6:9.1f} us")
        print(f"fit: latency {latency * 1e6:.0f} us, bandwidth {1 / slope / 1e9:.2f} GB/s")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.backend)
        return
    from autopipe.runtime.run.launch import free_port

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; "
        f"2 ranks x 1 thread, {args.backend}"
    )
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
        cmd = [sys.executable, __file__, "--worker", "--backend", args.backend]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
    codes = [p.wait(timeout=300) for p in procs]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
