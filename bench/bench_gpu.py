"""One-device speed of the trainer's parts on a ~1B random Llama (model=llama_1b: 16 x 2048), under
experiment=paper_8b's optimizer and precision (fp32 master weights, bf16 compute, fp32 head, AdamW at lr 5e-7):

- learner: seconds per step, MFU (6 x parameters x tokens per second / --peak-tflops; default the GPU kind's dense
  bf16 peak, ablate.cost.PEAK_TFLOPS, 989 for an H100 or H200; on a CPU a measured matmul), peak memory and the
  share of weights one step changes, for row and token-budget micro-batches, with and without activation
  checkpointing (its rollouts: random tokens, rewards 0 and 1 in turn, spread lengths);
- generators: tokens per second of the hf engine and of vLLM (when installed), R rows x N new tokens; vLLM's sync;
- whole run: experiment=paper_8b model=llama_1b on the synthetic task: seconds per step, idle and wait fractions,
  and the median bf16 log-prob gap between trainer and generator after the loads (train/logprob_gap).

The learner's "model GB" is the memory model's estimate (ablate/memory.py) beside the measured peak.

    python bench/bench_gpu.py                    # on a GPU (vLLM's part needs the vllm extra)
    python bench/bench_gpu.py --small            # on a CPU: a 4-layer model and small shapes, to check it works
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch
from common import run_trainer
from omegaconf import OmegaConf

from ablate import cost
from ablate.config import compose
from ablate.generators.engine import Engine, Limits, Sequence
from ablate.policy import build_policy, weights_in
from ablate.rollouts import Rollouts
from ablate.trainer import Learner

# paper_8b's layout is 16 trainer ranks and 64 engine processes: this benchmark's is one device
ONE_DEVICE = ["run=one_process", "run.trainer_gpus=1", "run.generator_gpus=0"]
# --small: a CPU's size, computing in fp32 (bf16 matmuls run ~50x slower than fp32 on CPUs without bf16 units: 0.9
# against 45 GFLOP/s measured on a 2-core machine like CI's)
SMALL = ["model.hidden_size=256", "model.intermediate_size=0", "model.num_layers=4", "model.num_heads=4",
         "model.vocab_size=4096", "model.dtype=float32"]


def _config(args, *overrides: str):
    shape = SMALL if args.small else []
    dtype = [f"model.dtype={args.dtype}"] if args.dtype else []
    cfg = compose(["experiment=paper_8b", *ONE_DEVICE, "model=llama_1b", *shape, *dtype, "generator=hf",
                   "task=synthetic", "optim.warmup_steps=1", f"model.device={args.device}", *overrides])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")


def _rollouts(n_rows: int, prompt: int, completion: int, vocab: int, seed: int = 0) -> Rollouts:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(completion // 4, completion + 1, (n_rows,), generator=g)
    mask = torch.arange(completion)[None, :] < lengths[:, None]
    tokens = torch.randint(3, vocab, (n_rows, completion), generator=g) * mask
    return Rollouts(
        prompt_ids=torch.arange(n_rows) // 16, group=torch.arange(n_rows) // 16,
        prompt_tokens=torch.randint(3, vocab, (n_rows, prompt), generator=g),
        prompt_mask=torch.ones(n_rows, prompt, dtype=torch.bool), tokens=tokens, mask=mask,
        gen_logprobs=-torch.rand(n_rows, completion, generator=g) * mask, versions=torch.zeros_like(tokens),
        lengths=lengths, rewards=(torch.arange(n_rows) % 2).float(),  # every prompt has reward variance
        correct=torch.zeros(n_rows, dtype=torch.bool), truncated=torch.zeros(n_rows, dtype=torch.bool))


def _sample(params: list[torch.Tensor], per_tensor: int = 100_000) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed sample of each tensor's elements (a full copy of 1B weights would not fit beside AdamW on a CPU)."""
    out = []
    for p in params:
        flat = p.detach().reshape(-1)
        index = torch.randint(0, flat.numel(), (min(per_tensor, flat.numel()),), device=flat.device)
        out.append((index, flat[index].clone()))
    return out


def _changed(params: list[torch.Tensor], before: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    moved = sum(int((p.detach().reshape(-1)[i] != v).sum()) for p, (i, v) in zip(params, before))
    return moved / sum(v.numel() for _, v in before)


def peak_tflops(args, device: torch.device, dtype: torch.dtype) -> float:
    """--peak-tflops; else on CUDA the dense bf16 peak of the device's kind (ablate.cost.PEAK_TFLOPS; another kind
    needs --peak-tflops); else a measured matmul in the compute dtype."""
    if args.peak_tflops:
        return args.peak_tflops
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = cost.peak_tflops(name)
        if peak is None:
            raise SystemExit(f"{name}: no dense bf16 peak for its kind in ablate.cost.PEAK_TFLOPS "
                             f"({', '.join(cost.PEAK_TFLOPS)}): give --peak-tflops")
        return peak
    n = 1024
    a = torch.randn(n, n, dtype=dtype)
    a @ a
    started = time.perf_counter()
    for _ in range(5):
        a @ a
    return 5 * 2 * n**3 / (time.perf_counter() - started) / 1e12


def learner(args, device: torch.device, peak: float) -> None:
    print(f"\nlearner: {args.rows} rows x ({args.prompt} prompt + <= {args.completion} completion) tokens, "
          f"AdamW at lr 5e-7, peak {peak:.3g} TFLOP/s")
    print(f"{'micro-batches':<34} {'s/step':>7} {'MFU':>6} {'peak GB':>8} {'model GB':>9} {'weights changed':>16}")
    budget = [f"train.micro_batch_tokens={args.token_budget}", "train.micro_batch_size=1024"]
    # (name, overrides, rows, completion); the long rows: where attention's T^2 terms show, which 1k-token rows hide
    forms = [("8 rows", ["train.micro_batch_size=8"], args.rows, args.completion),
             (f"{args.token_budget} tokens", budget, args.rows, args.completion),
             (f"{args.token_budget} tokens, rows <= {args.long_completion}", budget, max(args.rows // 8, 2),
              args.long_completion),
             (f"{args.token_budget} tokens + act. checkpointing", [*budget, "train.activation_checkpointing=true"],
              args.rows, args.completion)]
    for name, overrides, rows, completion in forms[:args.forms]:
        cfg = _config(args, *overrides)
        model = Learner(cfg)
        params = list(model.policy.parameters())
        n_params = sum(p.numel() for p in params)
        ro = _rollouts(rows, args.prompt, completion, model.policy.config.vocab_size)
        tokens = float(ro.prompt_mask.sum() + ro.lengths.sum())
        keep = torch.ones(ro.n, dtype=torch.bool)
        times, changed = [], []
        for step in range(args.learner_steps + 1):  # the first is warm-up
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            before = _sample(params)
            _sync(device)
            started = time.perf_counter()
            model.step(ro, ro.rewards, keep)
            _sync(device)
            times.append(time.perf_counter() - started)
            changed.append(_changed(params, before))
        seconds = sum(times[1:]) / len(times[1:])
        mfu = 6 * n_params * tokens / seconds / (peak * 1e12)
        print(f"{name:<34} {seconds:>7.2f} {mfu:>6.1%} {_peak_gb(device):>8.1f} {estimate_bytes(cfg, ro) / 2**30:>9.1f} "
              f"{' '.join(f'{c:.1%}' for c in changed):>16}", flush=True)
        del model, params


def estimate_bytes(cfg, ro: Rollouts) -> float:
    """The memory model's peak (ablate/memory.py, what the check before submit reads) for this learner at these
    rollouts' largest micro-batch, in bytes (bench/gpu_first.py reads it too)."""
    from ablate import memory
    from ablate.checks import model_shape
    from ablate.plan import micro_batches

    lengths = ro.prompt_mask.sum(dim=1) + ro.lengths
    batches = micro_batches(lengths, ro.mask.any(dim=1), cfg.train.micro_batch_size, cfg.train.micro_batch_tokens)
    tokens = max(len(b) * int(lengths[b].max()) for b in batches)
    estimate = memory.trainer(model_shape(cfg.model), ranks=1, micro_tokens=tokens,
                              checkpointing=bool(cfg.train.activation_checkpointing),
                              compute=getattr(torch, cfg.model.dtype).itemsize,
                              head=getattr(torch, cfg.precision.head_dtype).itemsize)
    return estimate.total


def generators(args, device: torch.device) -> None:
    cfg = _config(args)
    dtype = getattr(torch, cfg.model.dtype)
    policy = build_policy(cfg.model, 0)
    vocab = policy.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (128,), generator=g).tolist() for _ in range(args.gen_rows)]
    limits = Limits(args.new_tokens, 0, (), None)
    print(f"\ngenerators: {args.gen_rows} rows x {args.new_tokens} new tokens (128-token prompts)")
    print(f"{'engine':<8} {'tokens/s':>10} {'x hf':>6} {'weight sync s':>14}")
    engine = Engine(weights_in(policy, dtype).eval(), limits, head_dtype=torch.float32, compute_dtype=dtype,
                    temperature=1.0, pad_id=0, seed=0)
    rows = [Sequence(i, 1, p) for i, p in enumerate(prompts)]
    _sync(device)
    started = time.perf_counter()
    engine.start(rows)
    while engine.running:
        engine.step()
    _sync(device)
    hf = sum(len(r.tokens) for r in rows) / (time.perf_counter() - started)
    state = policy.state_dict()
    _sync(device)
    started = time.perf_counter()
    engine.load(state, 1)
    _sync(device)
    print(f"{'hf':<8} {hf:>10,.0f} {1.0:>6.1f} {time.perf_counter() - started:>14.3f}", flush=True)
    try:
        from ablate.generators.vllm_engine import VLLMEngine
    except ImportError as why:
        print(f"{'vllm':<8} not installed ({why})")
        return
    import tempfile

    folder = tempfile.mkdtemp(prefix="bench-gpu-")
    policy.save_pretrained(folder)
    from ablate.tasks.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(folder)
    vllm_engine = VLLMEngine(folder, limits, head_dtype=torch.float32, temperature=1.0, pad_id=0, seed=0,
                             compute_dtype=dtype, max_model_len=128 + args.new_tokens + 16,
                             enforce_eager=args.eager, gpu_memory_utilization=0.5,
                             kv_cache_bytes=2**30 if device.type == "cpu" else None)
    rows = [Sequence(i, 1, p) for i, p in enumerate(prompts)]
    started = time.perf_counter()
    vllm_engine.start(rows)
    while vllm_engine.running:
        vllm_engine.step()
    vllm = sum(len(r.tokens) for r in rows) / (time.perf_counter() - started)
    full = {name: t.float() for name, t in state.items()}  # the trainer's fp32 masters, as the pipeline sends them
    syncs = []
    for version in (1, 2, 3):
        started = time.perf_counter()
        vllm_engine.load(full, version)
        syncs.append(time.perf_counter() - started)
    print(f"{'vllm':<8} {vllm:>10,.0f} {vllm / hf:>6.1f} {min(syncs):>14.3f}", flush=True)
    vllm_engine.close()


def whole_run(args, device: torch.device) -> None:
    print(f"\nwhole run: experiment=paper_8b model=llama_1b, {args.run_steps} steps, "
          f"{args.run_prompts} x 16 completions of <= {args.run_tokens} tokens")
    print(f"{'generator':<10} {'s/step':>7} {'gen idle':>9} {'trainer wait':>13} {'logprob gap':>12}")
    for generator in args.run_generators.split(","):
        if generator == "vllm" and importlib.util.find_spec("vllm") is None:
            print(f"{generator:<10} not installed")
            continue
        shape = SMALL if args.small else []
        shape += [f"model.dtype={args.dtype}"] if args.dtype else []
        extra = ["generator.enforce_eager=true", "generator.kv_cache_gib=1"] if generator == "vllm" and \
            device.type == "cpu" else []
        run = run_trainer(["experiment=paper_8b", *ONE_DEVICE, "model=llama_1b", *shape,
                           f"model.device={args.device}",
                           f"generator={generator}", *extra, "task=synthetic", "task.warm_start_steps=0",
                           f"batch.prompts_per_step={args.run_prompts}", "batch.samples_per_prompt=16",
                           f"generation.max_think_tokens={args.run_tokens * 3 // 4}",
                           f"generation.max_answer_tokens={args.run_tokens // 4}", f"train.steps={args.run_steps}",
                           f"train.val_every={10 * args.run_steps}", "task.n_val_prompts=4", "task.val_samples=1",
                           "train.checkpoint_every=100000", *(["filtering=none"] if args.every_row else [])])
        body = run["steps"][1:-1] or run["steps"]  # the first step warms up; the last validates
        seconds = (body[-1][0] - run["steps"][0][0]) / max(len(body), 1)
        last = body[-1][1]
        # |log pi_train - log pi_gen| on the rows sampled wholly with the weights just loaded: the bf16 gap
        gaps = sorted(m["train/logprob_gap"] for _, m in run["steps"] if "train/logprob_gap" in m)
        gap = f"{gaps[len(gaps) // 2]:.4f}" if gaps else "-"
        print(f"{generator:<10} {seconds:>7.2f} {last['perf/generator_idle_frac']:>9.2f} "
              f"{last['perf/trainer_wait_frac']:>13.2f} {gap:>12}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a 4-layer model and small shapes (a CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="", help="the compute dtype (default: the preset's; bfloat16 on GPUs)")
    parser.add_argument("--forms", type=int, default=4, help="how many of the learner's micro-batch forms to run")
    parser.add_argument("--parts", default="learner,generators,run")
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--token-budget", type=int, default=16384, help="tokens per micro-batch, padded")
    parser.add_argument("--long-completion", type=int, default=8192,
                        help="the long-row form's completions (at most; a quarter to all of it)")
    parser.add_argument("--learner-steps", type=int, default=3)
    parser.add_argument("--gen-rows", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile / CUDA graphs")
    parser.add_argument("--run-steps", type=int, default=6)
    parser.add_argument("--run-prompts", type=int, default=8)
    parser.add_argument("--run-tokens", type=int, default=512)
    parser.add_argument("--run-generators", default="hf,vllm")
    parser.add_argument("--every-row", action="store_true",
                        help="whole run with filtering=none: random weights solve nothing, so zero-variance filtering "
                             "drops every row, and the log-prob gap is measured on the rows trained")
    args = parser.parse_args()
    if args.small:
        for name, value in (("rows", 32), ("prompt", 16), ("completion", 64), ("token_budget", 1024),
                            ("long_completion", 256),
                            ("gen_rows", 16), ("new_tokens", 32), ("run_prompts", 2), ("run_tokens", 32),
                            ("learner_steps", 2), ("run_steps", 4)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
        args.eager = True
    device = torch.device(args.device)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}"
          f"{', --small' if args.small else ''}")
    parts = args.parts.split(",")
    if "learner" in parts:
        learner(args, device, peak_tflops(args, device, getattr(torch, _config(args).model.dtype)))
    if "generators" in parts:
        generators(args, device)
    if "run" in parts:
        whole_run(args, device)


if __name__ == "__main__":
    main()
