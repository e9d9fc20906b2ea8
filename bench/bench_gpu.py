"""One-device speed of the trainer's parts on a ~1B random Llama (model=llama_1b: 16 x 2048), under
experiment=paper_8b's optimizer and precision (fp32 master weights, bf16 compute, fp32 head, AdamW at lr 5e-7):

- learner: seconds per step, MFU (6 x parameters x tokens per second / --peak-tflops; default the GPU kind's dense
  bf16 peak, ablate.cost.PEAK_TFLOPS, 989 for an H100 or H200; on a CPU a measured matmul), peak memory and the
  share of weights one step changes, for row and token-budget settings, with and without activation checkpointing
  (its rollouts: random tokens, rewards 0 and 1 in turn, spread lengths); each row labelled by the plan the learner
  made of its setting (packed or padded, passes a rank, the most tokens a pass computes) and the attention that ran;
- paper: the learner at a paper-like step (`paper`: a Llama-3.2-1B-shaped model, a trainer rank's 48 rows of
  lognormal completions up to 8k tokens, passes of at most 65,536 tokens, activation checkpointing), today's plan
  (bench/retired_plan.py's passes, the per-row scorer) beside the packed one (`plan.packed`, PackedScorer), in one
  process and FSDP-wrapped on a 1-rank process group, eager and with compiled layers (run.compile_layers=true):
  tokens/s, 6N-MFU, peak memory, whether the forms agree (their log-probs, their train/logprob_gap to a generator's,
  the weights one step changes and how), which attention ran (a packed form that fell back to the row-by-row path
  where varlen should run fails), and a compiled form's compile time, graph breaks and recompiles;
- generators: tokens per second of the hf engine and of vLLM (when installed), R rows x N new tokens; vLLM's sync;
- whole run: experiment=paper_8b model=llama_1b on the synthetic task: seconds per step, idle and wait fractions,
  and the median bf16 log-prob gap between trainer and generator after the loads (train/logprob_gap).

The learner's "model GB" is the memory model's estimate (ablate/memory.py) beside the measured peak. Which attention
ran is counted in a profile of an untimed pass (`attention_calls`): torch's varlen kernel is a custom op.

    python bench/bench_gpu.py                    # on a GPU (vLLM's part needs the vllm extra)
    python bench/bench_gpu.py --small            # on a CPU: a 4-layer model and small shapes, to check it works
    python bench/bench_gpu.py --parts paper      # the paper-like learner alone (gpu_check.py's second step)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import retired_plan
import torch
from common import run_trainer
from omegaconf import OmegaConf

from ablate import cost, plan
from ablate.config import compose
from ablate.generators.engine import Engine, Limits, Sequence
from ablate.policy import Scorer, build_policy, compute_dtype, packs_rows, weights_in
from ablate.registry import build
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


# --------------------------------------------------------------------- which attention ran, and each form's plan
# torch's varlen attention is a custom op (torch/nn/attention/varlen.py registers it under these names in torch
# 2.10, 2.11 and 2.13 alike): a profile counts its calls eager or inside a compiled graph. SDPA's is what a padded
# pass and the packed form's row-by-row fall-back (`ablate.policy._by_row`) call.
VARLEN_OPS = ("torch_attn::_varlen_attn", "torch_attn::_varlen_attn_backward")
SDPA_OP = "aten::scaled_dot_product_attention"


def attention_calls(run: Callable[[], object]) -> tuple[object, dict[str, int]]:
    """`run()`'s result and the attention ops it dispatched, from torch's profiler (CPU activity: each op as it is
    dispatched, on any device, the backward's on autograd's threads too): {"varlen", "varlen backward", "sdpa"}, the
    calls of each."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        result = run()
    # one a call: an op that re-dispatches itself (autocast's cast, then the op again) nests an event of its name
    names = Counter(event.name for event in profiled.events()
                    if event.cpu_parent is None or event.cpu_parent.name != event.name)
    return result, {"varlen": names[VARLEN_OPS[0]], "varlen backward": names[VARLEN_OPS[1]], "sdpa": names[SDPA_OP]}


def varlen_expected(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a packed pass should attend with torch's varlen kernel here: the project's one rule for it
    (ablate.policy.packs_rows, unset)."""
    return packs_rows(None, device, dtype)


def attention_verdict(calls: dict[str, int], packed: bool, device: torch.device, dtype: torch.dtype
                      ) -> tuple[str, bool]:
    """What attended (`attention_calls`), in words, and whether it is what the form should run here: a packed form
    varlen alone where the rule says varlen runs (a row-by-row fall-back there is a failure, not a slow result),
    row by row with SDPA elsewhere; a padded form SDPA."""
    varlen, sdpa = calls["varlen"], calls["sdpa"]
    said = f"varlen x{varlen}" + (f" (backward x{calls['varlen backward']})" if calls["varlen backward"] else "")
    if not packed:
        return f"padded: SDPA x{sdpa}", varlen == 0 and sdpa > 0
    if varlen_expected(device, dtype):
        return (said, sdpa == 0) if varlen else (f"FELL BACK to by row: SDPA x{sdpa}, no varlen", False)
    return f"by row: SDPA x{sdpa} (varlen: {why_no_varlen(device, dtype)})", varlen == 0 and sdpa > 0


def why_no_varlen(device: torch.device, dtype: torch.dtype) -> str:
    if device.type != "cuda":
        return f"not available on {device.type}"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"not in {str(dtype).removeprefix('torch.')}"
    return f"not on torch {torch.__version__}"


def plan_label(planned: plan.Plan) -> str:
    """A form's plan in a few words: packed or padded, its passes a rank, the most tokens a pass computes (padded:
    padding included) and, padded, the most rows a pass holds."""
    batches = [batch for passes in planned.passes for batch in passes if batch]
    tokens = max((planned.cost(batch)[0] for batch in batches), default=0)
    rows = f" x <= {max(len(b) for b in batches)} rows" if planned.form == "padded" and batches else ""
    count = planned.passes_per_rank
    return f"{planned.form}: {count} pass{'' if count == 1 else 'es'} of <= {tokens:,} tokens{rows}"


def compile_reset() -> None:
    """dynamo from nothing: no compiled code, no counts, no recorded recompiles."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def compile_counts() -> dict[str, object]:
    """dynamo's counts since `compile_reset` (torch._dynamo.utils.counters): graphs compiled, graph breaks and the
    first break's reason, recompiles (each a guard that failed: torch._dynamo.guard_failures) and the first's."""
    import torch._dynamo

    counters = torch._dynamo.utils.counters
    recompiles = [reason for reasons in torch._dynamo.guard_failures.values() for reason in reasons]
    breaks = counters["graph_break"]
    return {"graphs": counters["stats"]["unique_graphs"], "breaks": sum(breaks.values()),
            "break": str(next(iter(breaks), "")).splitlines()[0] if breaks else "", "recompiles": len(recompiles),
            "recompile": str(recompiles[0]).splitlines()[0] if recompiles else ""}


def _sample(params: list[torch.Tensor], per_tensor: int = 100_000, generator: torch.Generator | None = None
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed sample of each tensor's elements (a full copy of 1B weights would not fit beside AdamW on a CPU); with
    a seeded (CPU) `generator`, the same elements of tensors of the same shapes."""
    out = []
    for p in params:
        flat = p.detach().reshape(-1)
        index = torch.randint(0, flat.numel(), (min(per_tensor, flat.numel()),), generator=generator).to(flat.device)
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
          f"AdamW at lr 5e-7, peak {peak:.3g} TFLOP/s; each setting's plan as the learner makes it")
    print(f"{'set':<34} {'plan':<48} {'s/step':>7} {'MFU':>6} {'peak GB':>8} {'model GB':>9} {'weights changed':>16}"
          f"  attention (its first step)")
    budget = [f"train.micro_batch_tokens={args.token_budget}", "train.micro_batch_size=1024"]
    # (what is set, overrides, rows, completion); the long rows: where attention's T^2 terms show, which 1k-token rows
    # hide. Packed (CUDA, bf16) the first is one pass of up to paper_8b's 65,536 tokens, not 8 rows a pass
    forms = [("train.micro_batch_size=8", ["train.micro_batch_size=8"], args.rows, args.completion),
             (f"{args.token_budget} tokens a pass", budget, args.rows, args.completion),
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
        planned = model.step_plan(ro.prompt_mask.sum(dim=1) + ro.lengths, ro.mask.any(dim=1))
        times, changed, calls = [], [], {}
        for step in range(args.learner_steps + 1):  # the first is warm-up, its attention counted
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            before = _sample(params)
            _sync(device)
            started = time.perf_counter()
            if step:
                model.step(ro, ro.rewards, keep)
            else:
                _, calls = attention_calls(functools.partial(model.step, ro, ro.rewards, keep))
            _sync(device)
            times.append(time.perf_counter() - started)
            changed.append(_changed(params, before))
        seconds = sum(times[1:]) / len(times[1:])
        mfu = 6 * n_params * tokens / seconds / (peak * 1e12)
        said, _ = attention_verdict(calls, model.packed, device, compute_dtype(cfg.model))
        print(f"{name:<34} {plan_label(planned):<48} {seconds:>7.2f} {mfu:>6.1%} {_peak_gb(device):>8.1f} "
              f"{estimate_bytes(cfg, ro, planned) / 2**30:>9.1f} "
              f"{' '.join(f'{c:.1%}' for c in changed):>16}  {said}", flush=True)
        del model, params


def estimate_bytes(cfg, ro: Rollouts, planned: plan.Plan | None = None) -> float:
    """The memory model's peak (ablate/memory.py, what the check before submit reads) for this learner at these
    rollouts' largest micro-batch, in bytes (bench/gpu_first.py reads it too): the largest pass of `planned` (its
    computed tokens: padded or packed, a packed one with varlen's backward scratch), else of today's cut; the decoder
    layers recomputed as the learner counts them (`checkpointed`)."""
    from ablate import memory
    from ablate.checks import model_shape

    lengths = ro.prompt_mask.sum(dim=1) + ro.lengths
    if planned is None:
        batches = retired_plan.micro_batches(lengths, ro.mask.any(dim=1), cfg.train.micro_batch_size,
                                     cfg.train.micro_batch_tokens)
        tokens = max(len(b) * int(lengths[b].max()) for b in batches)
    else:
        tokens, largest = max((planned.cost(batch)[0], batch) for passes in planned.passes for batch in passes)
    shape = model_shape(cfg.model)
    compute = getattr(torch, cfg.model.dtype).itemsize
    # a packed pass in bf16/fp16 attends in FlashAttention's varlen kernel: its backward's scratch for the pass's rows
    varlen_rows = len(largest) if planned is not None and planned.form == "packed" and compute < 4 else 0
    estimate = memory.trainer(shape, ranks=1, micro_tokens=tokens, checkpointing=checkpointed(cfg, shape.layers),
                              compute=compute, head=getattr(torch, cfg.precision.head_dtype).itemsize,
                              varlen_rows=varlen_rows)
    return estimate.total


def checkpointed(cfg, layers: int) -> int:
    """The decoder layers the learner recomputes under train.activation_checkpointing (true, false, a count, or auto:
    the fewest the memory model needs on this machine's GPU, none on a CPU), as ablate.trainer.checkpoint_layers
    counts them off SLURM. Before, the estimate took bool() of the setting: a count or auto read as every layer."""
    from ablate import checks, memory

    setting = cfg.train.activation_checkpointing
    if setting == "auto":
        return checks.auto_checkpointed(cfg, checks.gpu_memory_gb(cfg, "local"))
    return memory.checkpointed_layers(setting, layers)


# ---------------------------------------------------------------------------------------- the paper-like learner
# A Llama-3.2-1B-shaped decoder (grouped K/V, tied embeddings, Llama-3's vocabulary; 1.24B parameters) with positions
# for every row; --small: a toy of the same kinds (grouped K/V, tied), for a CPU
PAPER_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "tie_word_embeddings": True, "num_hidden_layers": 16,
            "max_position_embeddings": 131072, "rope_theta": 500000.0}
PAPER_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": 512, "tie_word_embeddings": True, "num_hidden_layers": 2, "max_position_embeddings": 4096}
MID_TOP = 12288  # the interruption budget's top in bench/bench_learner_plan.py's law: lengths scale by cap / this


class TodayLearner(Learner):
    """The learner as it ran before ablate/plan.py: bench/retired_plan.py's passes (the rows dealt round robin by
    length, each rank's cut into padded micro-batches of at most train.micro_batch_size rows and
    train.micro_batch_tokens padded tokens, dummy passes where a rank has fewer), scored row by row
    (run.packed_rows=false)."""

    def step_plan(self, lengths: torch.Tensor, trained: torch.Tensor) -> plan.Plan:
        return retired_plan.round_robin(lengths, trained, self.ranks.world, self.micro_tokens, self.micro_batch,
                                        self.attention)


# --paper-forms: (the table's name, learner, packed rows, FSDP on a 1-rank process group, compiled layers)
PAPER_FORMS = {"today": ("today", TodayLearner, False, False, False), "packed": ("packed", Learner, True, False, False),
               "today-fsdp": ("today, FSDP 1 rank", TodayLearner, False, True, False),
               "packed-fsdp": ("packed, FSDP 1 rank", Learner, True, True, False),
               "packed-fsdp-compiled": ("packed, FSDP, compiled", Learner, True, True, True)}


def paper_lengths(prompts: int, samples: int, cap: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt and completion tokens ([prompts x samples] each), by bench/bench_learner_plan.py's law in its
    mid regime, every length scaled by cap / 12,288 (the top of its interruption; 2/3 at the default cap of 8,192)
    and each completion cut at `cap`: a prompt lognormal, median 250 (sigma 0.6, 32..2,048); its samples' thinking
    lognormal around the prompt's own median (4,000 x lognormal(0, 0.5)), sigma 0.7, interrupted at a budget uniform
    in 10,240..12,288 (+ the phrase's 20 tokens); an answer lognormal, median 200 (sigma 0.8, at most 2,048). At the
    defaults (3 prompts x 16, seed 0): completions of mean 3,791 and median 2,505 tokens, the longest 8,192;
    187,913 tokens in all."""
    from bench_learner_plan import REGIMES  # here, not at the top: it puts the source tree first on sys.path

    median, sigma = REGIMES["mid"]
    rng = np.random.default_rng([seed, list(REGIMES).index("mid")])
    rows, scale = prompts * samples, cap / MID_TOP
    prompt = np.clip(rng.lognormal(np.log(250), 0.6, prompts), 32, 2048).repeat(samples)
    own = (median * rng.lognormal(0.0, 0.5, prompts)).repeat(samples)  # each prompt's median: its difficulty
    think = rng.lognormal(np.log(own), sigma)
    budget = rng.integers(10240, 12289, rows)
    think = np.where(think > budget, budget + 20, think)
    answer = np.clip(rng.lognormal(np.log(200), 0.8, rows), 1, 2048)
    prompt = np.maximum(np.round(prompt * scale), 1)
    completion = np.clip(np.round((think + answer) * scale), 1, cap)
    return torch.tensor(prompt, dtype=torch.long), torch.tensor(completion, dtype=torch.long)


def _paper_rollouts(prompt: torch.Tensor, completion: torch.Tensor, samples: int, vocab: int, cap: int,
                    seed: int = 0) -> Rollouts:
    """Rows of these prompt and completion lengths (prompts left-padded, completions right-padded; random tokens;
    rewards 0 and 1 in turn, so every prompt's group has variance); gen_logprobs 0 until `_generator_logprobs`."""
    g = torch.Generator().manual_seed(seed)
    n, P, T = len(prompt), int(prompt.max()), int(completion.max())
    prompt_mask = torch.arange(P)[None, :] >= (P - prompt)[:, None]
    mask = torch.arange(T)[None, :] < completion[:, None]
    tokens = torch.randint(3, vocab, (n, T), generator=g) * mask
    return Rollouts(prompt_ids=torch.arange(n) // samples, group=torch.arange(n) // samples,
                    prompt_tokens=torch.randint(3, vocab, (n, P), generator=g) * prompt_mask, prompt_mask=prompt_mask,
                    tokens=tokens, mask=mask, gen_logprobs=torch.zeros(n, T), versions=torch.zeros_like(tokens),
                    lengths=completion, rewards=(torch.arange(n) % 2).float(),
                    correct=torch.zeros(n, dtype=torch.bool), truncated=completion >= cap)


def _paper_config(args, folder: str, *overrides: str):
    dtype = "float32" if args.small and not args.dtype else args.dtype or "bfloat16"
    cfg = compose(["experiment=paper_8b", *ONE_DEVICE, f"model.path={folder}", f"model.dtype={dtype}", "generator=hf",
                   "task=synthetic", "optim.warmup_steps=1", f"model.device={args.device}",
                   f"train.micro_batch_tokens={args.paper_budget}", f"train.micro_batch_size={args.paper_pass_rows}",
                   f"train.activation_checkpointing={args.paper_checkpointing}", *overrides])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


@torch.no_grad()
def _logprobs(scorer: torch.nn.Module, ro: Rollouts, planned: plan.Plan) -> torch.Tensor:
    """Every trained row's completion log-probs [N, T] (0 past each length), on the CPU in fp32: `scorer` called pass
    by pass as `planned` has rank 0 run them, each pass cut as Learner.step cuts it."""
    out = torch.zeros(ro.tokens.shape, dtype=torch.float32)
    prompt_lengths = ro.prompt_mask.sum(dim=1)
    for batch in planned.passes[0]:
        if not batch:
            continue
        rows = torch.tensor(batch, dtype=torch.long, device=ro.tokens.device)
        P, T = int(prompt_lengths[rows].max()), max(int(ro.lengths[rows].max()), 1)
        prompt = slice(ro.prompt_tokens.shape[1] - P, None)
        logp = scorer(ro.prompt_tokens[rows, prompt], ro.prompt_mask[rows, prompt], ro.tokens[rows, :T],
                      ro.lengths[rows])
        out[rows.cpu(), :T] = logp.float().cpu()
    return out


def _generator_logprobs(cfg, ro: Rollouts, planned: plan.Plan) -> torch.Tensor:
    """The rows' log-probs as a generator takes them, which each form's train/logprob_gap is measured against: the
    learner's initial weights in the compute dtype (`weights_in`, as an engine holds them), the precision option's
    head, row by row (Scorer)."""
    dtype = compute_dtype(cfg.model)
    policy = weights_in(build_policy(cfg.model, cfg.seed, read_weights=False), dtype).eval()
    out = _logprobs(Scorer(policy, build(cfg.precision), float(cfg.generation.temperature), dtype), ro, planned)
    del policy
    return out


def _whole(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """FSDP2's parameters as their local shards: on one rank, the whole tensor."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in params]


def _moved(params: list[torch.Tensor], before: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The sampled elements' change since `before` (`_sample`), one fp32 vector on the CPU."""
    return torch.cat([(p.detach().reshape(-1)[i] - v).float().cpu() for p, (i, v) in zip(_whole(params), before)])


@contextlib.contextmanager
def _one_rank(device: torch.device):
    """A 1-rank process group (NCCL on a GPU, gloo on the CPU) for the FSDP layout, unless one is up already."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, device_id=torch.device("cuda", torch.cuda.current_device())
                                if device.type == "cuda" else None)
    try:
        yield
    finally:
        if owned:
            dist.destroy_process_group()


def _paper_form(args, cfg, key: str, ro: Rollouts, device: torch.device, peak: float) -> dict:
    """One form of the learner on the rows: its plan's passes, every row's log-probs before the step (the pass whose
    attention is counted), the sampled weights' change by one step (from the same initial weights in every form, its
    loss and train/logprob_gap; it warms up: a compiled form compiles in it) and --paper-steps timed steps after it,
    with their peak memory; a compiled form's dynamo counts."""
    from ablate.distributed.layouts import FSDP

    name, learner_class, packed, fsdp, compiled = PAPER_FORMS[key]
    cfg = OmegaConf.merge(cfg, {"run": {"packed_rows": packed, "compile_layers": compiled}})
    keep = torch.ones(ro.n, dtype=torch.bool, device=device)
    lengths = (ro.prompt_mask.sum(dim=1) + ro.lengths).cpu()
    if compiled:
        compile_reset()
    with _one_rank(device) if fsdp else contextlib.nullcontext():
        learner = learner_class(cfg, build_policy(cfg.model, cfg.seed, read_weights=False),
                                ranks=FSDP(trainer_gpus=1) if fsdp else None)
        planned = learner.step_plan(lengths, torch.ones(ro.n, dtype=torch.bool))
        # the parameters as they are between steps (FSDP2's shards; a forward leaves the root's unsharded)
        n_params = sum(p.numel() for p in learner.policy.parameters())
        before = _sample(_whole(list(learner.policy.parameters())), args.paper_sample,
                         torch.Generator().manual_seed(0))
        _sync(device)
        began = time.perf_counter()
        logp, calls = attention_calls(functools.partial(_logprobs, learner.scorer, ro, planned))
        _sync(device)
        first = [time.perf_counter() - began]
        metrics = learner.step(ro, ro.rewards, keep)  # from the initial weights, as every form's: compared
        _sync(device)
        first.append(time.perf_counter() - began - first[0])
        moved = _moved(list(learner.policy.parameters()), before)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.paper_steps):
            _sync(device)
            began = time.perf_counter()
            learner.step(ro, ro.rewards, keep)
            _sync(device)
            times.append(time.perf_counter() - began)
        checkpointed_layers = learner.checkpointed
        del learner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    seconds = sum(times) / len(times)
    tokens = float(lengths.sum())
    said, right = attention_verdict(calls, packed, device, compute_dtype(cfg.model))
    return {"name": name, "plan": planned, "logp": logp, "moved": moved, "gap": metrics.get("train/logprob_gap"),
            "loss": metrics["loss/policy"], "seconds": seconds, "first": first, "tokens_s": tokens / seconds,
            "mfu": 6 * n_params * tokens / seconds / (peak * 1e12), "peak_gb": _peak_gb(device),
            "model_gb": estimate_bytes(cfg, ro, planned) / 2**30, "checkpointed": checkpointed_layers,
            "n_params": n_params, "attention": said, "attention_ok": right,
            "compiled": compile_counts() if compiled else None}


def _agreement(form: dict, reference: dict, mask: torch.Tensor) -> tuple[float, float, float]:
    """How `form` agrees with `reference`: its log-probs' mean and largest |difference| over the completions'
    tokens, and the cosine of the two forms' one-step changes of the sampled weights."""
    diff = (form["logp"] - reference["logp"]).abs()[mask]
    a, b = form["moved"].double(), reference["moved"].double()
    cosine = float(a @ b / (a.norm() * b.norm())) if a.norm() and b.norm() else float("nan")
    return float(diff.mean()), float(diff.max()), cosine


def paper(args, device: torch.device, peak: float) -> None:
    """The learner at a paper-like step, today's plan beside the packed one (issue 46): module docstring. A form
    that raises is a row saying so, the others still run; then it exits 1."""
    unknown = [key for key in args.paper_forms.split(",") if key not in PAPER_FORMS]
    if unknown:
        raise SystemExit(f"--paper-forms: {', '.join(unknown)}: none of {', '.join(PAPER_FORMS)}")
    shape = PAPER_SMALL if args.small else PAPER_1B
    prompt, completion = paper_lengths(args.paper_prompts, args.paper_samples, args.paper_cap)
    longest = int((prompt + completion).max())
    if longest > shape["max_position_embeddings"]:
        raise SystemExit(f"--paper-cap {args.paper_cap}: a row of {longest} tokens, past the model's "
                         f"{shape['max_position_embeddings']} positions")
    import transformers

    with tempfile.TemporaryDirectory(prefix="bench-gpu-paper-") as folder:
        transformers.LlamaConfig(**shape).save_pretrained(folder)  # the shape alone: random weights, seeded
        _paper(args, device, peak, shape, prompt, completion, _paper_config(args, folder))


def _paper(args, device: torch.device, peak: float, shape: dict, prompt: torch.Tensor, completion: torch.Tensor,
           cfg) -> None:
    ro = _paper_rollouts(prompt, completion, args.paper_samples, shape["vocab_size"], args.paper_cap).to(device)
    lengths, trained = (prompt + completion), torch.ones(len(prompt), dtype=torch.bool)
    today = retired_plan.round_robin(lengths, trained, 1, args.paper_budget, args.paper_pass_rows)
    ro.gen_logprobs = _generator_logprobs(cfg, ro, today).to(device) * ro.mask
    print(f"\npaper-like learner: {'PAPER_SMALL' if args.small else 'Llama-3.2-1B'}-shaped, {len(prompt)} rows "
          f"({args.paper_prompts} prompts x {args.paper_samples}), prompts median {int(prompt.median())}, "
          f"completions <= {args.paper_cap} (mean {completion.float().mean():,.0f}, median "
          f"{int(completion.median()):,}, {int((completion >= args.paper_cap).sum())} at the cap), "
          f"{int(lengths.sum()):,} tokens; passes of <= {args.paper_budget:,} tokens (today's: <= "
          f"{args.paper_pass_rows} rows, padded), train.activation_checkpointing={args.paper_checkpointing}, "
          f"{cfg.model.dtype} compute, peak {peak:.3g} TFLOP/s; 1 step from the initial weights (compared), then "
          f"{args.paper_steps} timed", flush=True)
    print(f"{'form':<22} {'plan (a rank)':<44} {'real/computed':>13} {'s/step':>7} {'tokens/s':>9} {'MFU':>6} "
          f"{'peak GB':>8} {'model GB':>9} {'logprob gap':>11} {'vs first: mean':>14} {'max':>8} "
          f"{'weights changed':>15} {'update cos':>10}  attention (the log-prob pass)", flush=True)
    results, failed, mask = [], [], ro.mask.cpu()
    for key in args.paper_forms.split(","):
        try:
            form = _paper_form(args, cfg, key, ro, device, peak)
        except Exception as why:  # noqa: BLE001 - one form's failure is a row; the others still run
            failed.append(f"{key} raised")
            print(f"{PAPER_FORMS[key][0]:<22} raised {type(why).__name__}: {str(why).splitlines()[0][:160]}",
                  flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        results.append(form)
        if not form["attention_ok"]:
            failed.append(f"{key} attended as it should not here")
        mean, most, cosine = _agreement(form, results[0], mask)
        gap = "-" if form["gap"] is None else f"{form['gap']:.2e}"
        print(f"{form['name']:<22} {plan_label(form['plan']):<44} {form['plan'].token_efficiency:>13.3f} "
              f"{form['seconds']:>7.2f} {form['tokens_s']:>9,.0f} {form['mfu']:>6.1%} {form['peak_gb']:>8.1f} "
              f"{form['model_gb']:>9.1f} {gap:>11} {mean:>14.1e} {most:>8.1e} "
              f"{float((form['moved'] != 0).float().mean()):>15.2%} {cosine:>10.4f}  "
              f"{form['attention']}{'' if form['attention_ok'] else ': FAILED'}", flush=True)
    if results:
        print(f"(1 step changes the weights from the same initial ones in every form; {results[0]['checkpointed']} "
              f"of {shape['num_hidden_layers']} layers recomputed; {results[0]['n_params']:,} parameters)")
    by_name = {form["name"]: form for form in results}
    for new, old in (("packed", "today"), ("packed, FSDP 1 rank", "today, FSDP 1 rank"),
                     ("packed, FSDP, compiled", "packed, FSDP 1 rank")):
        if new in by_name and old in by_name:
            mean, most, cosine = _agreement(by_name[new], by_name[old], mask)
            gaps = [by_name[n]["gap"] for n in (new, old)]
            print(f"{new} vs {old}: x{by_name[new]['tokens_s'] / by_name[old]['tokens_s']:.2f} tokens/s; log-probs "
                  f"mean |diff| {mean:.1e}, max {most:.1e}; logprob gap {gaps[0] or 0:.2e} vs {gaps[1] or 0:.2e}; "
                  f"weights changed {float((by_name[new]['moved'] != 0).float().mean()):.2%} vs "
                  f"{float((by_name[old]['moved'] != 0).float().mean()):.2%}, update cosine {cosine:.4f}; loss "
                  f"{by_name[new]['loss']:.6g} vs {by_name[old]['loss']:.6g}", flush=True)
    for form in results:
        if form["compiled"] is not None:
            counts, (logprob_s, step_s) = form["compiled"], form["first"]
            breaks = f" (the first: {counts['break']})" if counts["breaks"] else ""
            recompiles = f" (the first: {counts['recompile']})" if counts["recompiles"] else ""
            print(f"{form['name']}: the first log-prob pass {logprob_s:.1f} s and step {step_s:.1f} s (compiling), "
                  f"then {form['seconds']:.2f} s a step; {counts['graphs']} graphs, {counts['breaks']} graph breaks"
                  f"{breaks}, {counts['recompiles']} recompiles{recompiles}", flush=True)
    if failed:
        raise SystemExit(f"paper: {'; '.join(failed)} (above)")


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
    parser.add_argument("--parts", default="learner,paper,generators,run")
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--token-budget", type=int, default=16384, help="tokens per micro-batch, padded")
    parser.add_argument("--long-completion", type=int, default=8192,
                        help="the long-row form's completions (at most; a quarter to all of it)")
    parser.add_argument("--learner-steps", type=int, default=3)
    parser.add_argument("--paper-prompts", type=int, default=3, help="paper: prompts (3 x 16: a trainer rank's "
                        "share of the paper's 48 x 16 rows over 16 ranks)")
    parser.add_argument("--paper-samples", type=int, default=16)
    parser.add_argument("--paper-cap", type=int, default=8192, help="paper: the completions' cap (the law's scale)")
    parser.add_argument("--paper-budget", type=int, default=65536,
                        help="paper: tokens a pass (train.micro_batch_tokens; today's plan: padded)")
    parser.add_argument("--paper-pass-rows", type=int, default=8, help="paper: rows a pass of today's plan, at most")
    parser.add_argument("--paper-checkpointing", default="true",
                        help="paper: train.activation_checkpointing (true, false, a count, auto)")
    parser.add_argument("--paper-steps", type=int, default=2, help="paper: timed steps a form, after the one "
                        "from the initial weights (which warms up, and compiles a compiled form)")
    parser.add_argument("--paper-forms", default=",".join(PAPER_FORMS), help="paper: which forms, in order (the "
                        f"first is the one the others are compared with): {', '.join(PAPER_FORMS)}")
    parser.add_argument("--paper-sample", type=int, default=20_000, help="paper: weights sampled a tensor")
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
                            ("learner_steps", 2), ("run_steps", 4), ("paper_prompts", 2), ("paper_samples", 4),
                            ("paper_cap", 96), ("paper_budget", 256), ("paper_pass_rows", 4), ("paper_steps", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
        args.eager = True
    device = torch.device(args.device)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}"
          f"{', --small' if args.small else ''}")
    parts = args.parts.split(",")
    if "learner" in parts:
        learner(args, device, peak_tflops(args, device, getattr(torch, _config(args).model.dtype)))
    if "paper" in parts:
        paper(args, device, peak_tflops(args, device, torch.float32 if args.small and not args.dtype else
                                         getattr(torch, args.dtype or "bfloat16")))
    if "generators" in parts:
        generators(args, device)
    if "run" in parts:
        whole_run(args, device)


if __name__ == "__main__":
    main()
