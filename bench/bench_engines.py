"""Rank 0's cost per generated token with the engine in its own process (run.generator_gpus=0), in 1 and in 2
engine processes: the generator=hf pipeline alone (no learner), deterministic, the same prompts and weights, a new
version published after every batch. Each process runs torch on one thread. `--reach 1` looks after every decode
step, as the engine processes were driven before they ran free between looks (ablate/generators/pipeline.py).
`--concurrent` runs the generator's own thread (generator=vllm's default), whose looks are capped in seconds too:
`--decode-ms` slows each decode step and `--exchange-ms` each message between rank 0 and an engine process, as a
large model and a network would.

    python bench/bench_engines.py                   # model=small, 10 batches of 8 x 4 rows
    python bench/bench_engines.py --model tiny --reach 1
    python bench/bench_engines.py --model tiny --concurrent --decode-ms 30 --exchange-ms 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _slowed(decode_s: float, exchange_s: float) -> None:
    """This process's decode steps and control messages made slower by these seconds each (a large model, a network)."""
    from ablate.generators import engine, remote

    if decode_s:
        step = engine.Engine.step
        engine.Engine.step = lambda self: (time.sleep(decode_s), step(self))[1]
    if exchange_s:
        exchange = remote._exchange
        remote._exchange = lambda *args: (time.sleep(exchange_s), exchange(*args))[1]


def _run(rank: int, engines: int, store: str, overrides: list[str], reach: int, batches: int, out: str,
         decode_s: float = 0.0, exchange_s: float = 0.0) -> None:
    import torch.distributed as dist

    from ablate.config import compose
    from ablate.distributed.groups import Groups, connect
    from ablate.distributed.layouts import OneProcess, Weights
    from ablate.generators import pipeline, remote
    from ablate.policy import build_policy, build_tokenizer
    from ablate.registry import build
    from ablate.trainer import PromptSampler

    torch.set_num_threads(1)
    _slowed(decode_s, exchange_s if rank == 0 else 0.0)  # an exchange is slowed once, on rank 0's side
    groups = connect(dist.FileStore(store, 1 + engines), rank, trainers=1, engines=engines, backend="gloo") \
        if engines else Groups()
    if rank > 0:
        remote.serve(groups)
        groups.shutdown()
        return
    pipeline.RUN_AHEAD_STEPS = reach
    cfg = compose([*overrides, f"run.generator_gpus={engines}"])
    tok = build_tokenizer(cfg.model)
    task = build(cfg.task, tokenizer=tok, seed=cfg.seed)
    policy = build_policy(cfg.model, cfg.seed, tok)
    sampler = PromptSampler(task.size("train"), cfg.seed, build(cfg.filtering))
    generator = build(cfg.generator, cfg=cfg, task=task, sampler=sampler, policy=Weights(OneProcess(groups), policy))
    seconds, cpu, tokens = [], [], []
    for step in range(1, batches + 1):
        wall, own = time.perf_counter(), time.process_time()
        ro = generator.batch(step)
        seconds.append(time.perf_counter() - wall)
        cpu.append(time.process_time() - own)
        tokens.append(int(ro.lengths.sum()))
        if step == 2:  # the first two batches start the waves: the steady state is measured after them
            generator.perf()
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1e-3 * torch.randn_like(p))
        generator.publish(Weights(OneProcess(groups), policy), step)
    looks = generator.perf()["perf/decode_steps_per_look"]
    generator.close()
    groups.shutdown()
    torch.save({"seconds": seconds, "cpu": cpu, "tokens": tokens, "looks": looks}, out)


def measure(engines: int, overrides: list[str], reach: int, batches: int, decode_s: float = 0.0,
            exchange_s: float = 0.0) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "out")
        torch.multiprocessing.start_processes(_run, args=(engines, str(Path(folder) / "store"), overrides, reach,
                                                          batches, out, decode_s, exchange_s),
                                              nprocs=1 + engines, start_method="spawn")
        r = torch.load(out)
    skip = 2  # the first two batches start the waves: the others are the steady state
    tokens = sum(r["tokens"][skip:])
    return {"us_per_token": 1e6 * sum(r["seconds"][skip:]) / tokens, "cpu_us_per_token": 1e6 * sum(r["cpu"][skip:])
            / tokens, "tokens": tokens, "steps_per_look": r["looks"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small", help="model option (tiny: ~150k parameters, small: ~4M)")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--reach", type=int, default=None, help="decode steps between looks at most (default: the "
                   "pipeline's RUN_AHEAD_STEPS; 1: look after every step, the lockstep of before)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each layout, interleaved (the best is kept)")
    p.add_argument("--concurrent", action="store_true", help="the generator's own thread (generator.concurrent)")
    p.add_argument("--decode-ms", type=float, default=0.0, help="added to each decode step")
    p.add_argument("--exchange-ms", type=float, default=0.0, help="added to each message to an engine process")
    a = p.parse_args()
    from ablate.generators.pipeline import RUN_AHEAD_STEPS

    reach = a.reach or RUN_AHEAD_STEPS
    overrides = [f"model={a.model}", "model.device=cpu", "batch.prompts_per_step=8", "batch.samples_per_prompt=4",
                 "generation.max_think_tokens=48", "generation.max_answer_tokens=16", "length_control=truncation",
                 "generator.max_waves=2", f"generator.concurrent={str(a.concurrent).lower()}"]
    best: dict[int, dict] = {}
    for _ in range(a.repeats):  # interleaved: a noisy machine slows every layout alike
        for engines in (0, 1, 2):
            r = measure(engines, overrides, reach, a.batches, a.decode_ms / 1e3, a.exchange_ms / 1e3)
            if engines not in best or r["us_per_token"] < best[engines]["us_per_token"]:
                best[engines] = r
    print(f"model={a.model}, {a.batches - 2} batches of 8 x 4 rows after the first two, decode steps between looks at "
          f"most {reach}; one torch thread a process ({torch.get_num_threads()} cores here); "
          f"{'concurrent' if a.concurrent else 'deterministic'}, decode steps +{a.decode_ms:g} ms, exchanges "
          f"+{a.exchange_ms:g} ms")
    print(f"{'engine processes':>16} {'us/token':>9} {'rank 0 CPU us/token':>20} {'steps/look':>11} "
          f"{'vs in-process':>14}")
    base = best[0]["us_per_token"]
    for engines, r in best.items():
        print(f"{engines:>16} {r['us_per_token']:>9.1f} {r['cpu_us_per_token']:>20.1f} {r['steps_per_look']:>11.1f} "
              f"{r['us_per_token'] / base - 1:>+14.1%}")


if __name__ == "__main__":
    main()
