"""Gradient memory of a trainer rank under FSDP2 gradient accumulation, 2 gloo ranks on the CPU: the peak bytes of
gradients a rank holds between the passes of one learner step (and before the update), with run.sharded_gradients
true (each pass reduce-scattered into the shards: the default) and false (FSDP2's no-sync: a whole fp32 gradient
accumulated on every rank, reduced once), beside 4N bytes (a whole fp32 gradient) and the step's time.

    python bench/bench_fsdp_memory.py                 # model=small, bf16 compute, 64 rows in micro-batches of 4
    python bench/bench_fsdp_memory.py --model tiny --dtype float32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORLD = 2


def _rank(rank: int, init_file: str, overrides: list[str], out: str) -> None:
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ablate.config import compose
    from ablate.distributed.layouts import FSDP
    from ablate.registry import build
    from ablate.trainer import Learner

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    cfg = OmegaConf.create(OmegaConf.to_container(compose(overrides), resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(4)), 0, compute=2000.0)
    batch = (ro, (torch.arange(ro.n) % 3 == 0).float(), torch.ones(ro.n, dtype=torch.bool))
    results = {}
    for sharded in (False, True, False, True):  # twice each, interleaved: the second of each is timed
        learner = Learner(cfg, ranks=FSDP(sharded_gradients=sharded))
        held = []
        measure = lambda *_: held.append(learner.ranks.gradient_bytes(learner.scorer))  # noqa: E731
        learner.scorer.register_forward_pre_hook(measure)
        learner.optimizer.register_step_pre_hook(measure)
        began = time.perf_counter()
        learner.step(*batch)
        params = sum(p.numel() for p in learner.policy.parameters())
        results[sharded] = {"peak": max(held), "passes": len(held) - 1, "seconds": time.perf_counter() - began,
                            "params": params}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small", help="model option (small: ~4M parameters)")
    p.add_argument("--dtype", default="bfloat16", help="model.dtype: the compute dtype")
    p.add_argument("--micro-batch", type=int, default=4, help="train.micro_batch_size")
    a = p.parse_args()
    overrides = ["generator=mock", f"model={a.model}", f"model.dtype={a.dtype}", "model.device=cpu",
                 f"train.micro_batch_size={a.micro_batch}"]
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "out")
        torch.multiprocessing.start_processes(_rank, args=(str(Path(folder) / "init"), overrides, out), nprocs=WORLD,
                                              start_method="spawn")
        results = torch.load(out)
    whole = 4 * results[True]["params"]
    print(f"model={a.model} ({results[True]['params'] / 1e6:.1f}M parameters), {a.dtype} compute, {WORLD} gloo ranks, "
          f"{results[True]['passes']} passes a rank in one step; a whole fp32 gradient is {whole / 2**20:.1f} MiB")
    print(f"{'run.sharded_gradients':>22} {'peak gradient MiB a rank':>25} {'x whole':>8} {'step s':>7}")
    for sharded in (False, True):
        r = results[sharded]
        print(f"{str(sharded).lower():>22} {r['peak'] / 2**20:>25.2f} {r['peak'] / whole:>8.2f} {r['seconds']:>7.2f}")


if __name__ == "__main__":
    main()
