"""The LM head's numerics: the sampled tokens' log-probs from each way of computing the head's matmul, against an
fp64 reference and against the generator's (vLLM's fp32 head: bf16 operands into fp32 output), on CPU.

    python bench/bench_head.py                      # H 4096, V 32768, 2048 tokens, logits of std 3
    python bench/bench_head.py --hidden 2048 --vocab 151936 --tokens 512
    python bench/bench_head.py --model-hidden 512   # and a tiny bf16 model: each option's train/logprob_gap

Part 2 runs a tiny random Llama (the code tokenizer's vocabulary) with bf16 compute through our engine (the
generator: its bf16 copy, the fp32 head on bf16 operands, as vLLM's) and the trainer's scorer (fp32 masters under
autocast) with each precision option: the trainer-generator gap per sampled token (train/logprob_gap) and each
side's distance from the same model in fp64.

Hidden states are unit-variance (an RMS norm's output), the head's weights scaled so the logits have `--logit-std`,
one logit a row raised by `--peak` (a model sure of its next token), tokens sampled from the fp64 softmax at
temperature 1, as rollouts are. The figures: docs/peers.md#the-lm-heads-precision.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, form: str) -> torch.Tensor:
    """The targets' log-probs with the head's matmul in `form`; the log-softmax in the output's precision (fp64 for
    the reference, fp32 otherwise)."""
    if form == "fp64":
        logits = hidden.double() @ weight.double().T
    elif form == "fp32 operands (true fp32 GEMM)":
        logits = hidden.float() @ weight.float().T
    elif form == "bf16 operands, fp32 output":  # what tensor cores do with fp32 accumulation; vLLM's fp32 head
        logits = hidden.bfloat16().float() @ weight.bfloat16().float().T
    elif form == "bf16 logits":
        logits = (hidden.bfloat16() @ weight.bfloat16().T).float()
    else:
        raise ValueError(form)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


FORMS = ("fp32 operands (true fp32 GEMM)", "bf16 operands, fp32 output", "bf16 logits")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--logit-std", type=float, default=3.0)
    p.add_argument("--peak", type=float, default=10.0, help="added to one logit a row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-hidden", type=int, default=256, help="part 2's model width (0: no part 2)")
    p.add_argument("--model-rows", type=int, default=32)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    hidden = torch.randn(a.tokens, a.hidden, dtype=torch.float64)
    weight = torch.randn(a.vocab, a.hidden, dtype=torch.float64) * a.logit_std / a.hidden ** 0.5
    sure = torch.randint(a.vocab, (a.tokens,))  # each row's likeliest token: its hidden state leans towards it
    hidden += a.peak * weight[sure] / weight[sure].norm(dim=-1, keepdim=True) ** 2
    reference_logits = hidden @ weight.T
    targets = torch.multinomial(torch.softmax(reference_logits, dim=-1), 1).squeeze(-1)
    exact = logprobs(hidden, weight, targets, "fp64")
    generator = logprobs(hidden, weight, targets, "bf16 operands, fp32 output").double()
    print(f"H {a.hidden}, V {a.vocab}, {a.tokens} sampled tokens, logits of std {a.logit_std} (+{a.peak} on one a "
          f"row); mean log-prob of the sampled tokens {exact.mean():.3f}")
    print(f"{'head matmul':<32} {'mean |d| vs fp64':>17} {'max |d| vs fp64':>16} {'mean |d| vs generator':>22}")
    for form in FORMS:
        got = logprobs(hidden, weight, targets, form).double()
        print(f"{form:<32} {(got - exact).abs().mean():>17.2e} {(got - exact).abs().max():>16.2e} "
              f"{(got - generator).abs().mean():>22.2e}")
    if a.model_hidden:
        model_gaps(a.model_hidden, a.model_rows)


def model_gaps(hidden_size: int, rows: int) -> None:
    """Part 2 (see the module's docstring)."""
    import copy

    from omegaconf import OmegaConf

    from ablate.generators.engine import Engine, Limits, Sequence
    from ablate.generators.pipeline import assemble
    from ablate.policy import build_policy, completion_logprobs, weights_in
    from ablate.rl import precision
    from ablate.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = OmegaConf.create({"name": "tiny", "path": None, "vocab_size": 0, "hidden_size": hidden_size,
                              "num_layers": 2, "num_heads": 4, "dtype": "bfloat16", "device": "cpu"})
    master = build_policy(model, 1, tok)
    engine = Engine(weights_in(copy.deepcopy(master), torch.bfloat16).eval(),
                    Limits(24, 8, (tok.eos_token_id,), tok.convert_tokens_to_ids("</think>")),
                    head_dtype=torch.float32, compute_dtype=torch.bfloat16, temperature=1.0, pad_id=0, seed=3)
    seqs = [Sequence(i, 1, tok.encode(f"reverse {i * 7919 % 100000}:", add_special_tokens=False))
            for i in range(rows)]
    engine.start(seqs)
    while engine.running:
        engine.step()
    ro = assemble(seqs, torch.zeros(rows, dtype=torch.bool), list(range(rows)), tok.pad_token_id)
    args = (ro.prompt_tokens, ro.prompt_mask, ro.tokens, ro.lengths)

    def fp64_head(h, w, targets, *, bias=None, **_):
        return torch.log_softmax(h.double() @ w.double().T, -1).gather(-1, targets[..., None]).squeeze(-1)

    with torch.no_grad():
        exact = completion_logprobs(copy.deepcopy(master).double(), *args, fp64_head)[ro.mask]
        generator = ro.gen_logprobs[ro.mask].double()
        print(f"\na tiny Llama, H {hidden_size}, bf16 compute: {int(ro.mask.sum())} sampled tokens; the generator "
              f"(our engine, fp32 head on bf16 operands) {(generator - exact).abs().mean():.2e} from fp64 a token")
        print(f"{'trainer head':<12} {'train/logprob_gap':>18} {'max':>9} {'vs fp64':>9}")
        for name in ("fp32_head", "fp32_exact", "bf16"):
            logp = completion_logprobs(master, *args, getattr(precision, name),
                                       compute_dtype=torch.bfloat16)[ro.mask].double()
            gap = (logp - generator).abs()
            print(f"{name:<12} {gap.mean():>18.2e} {gap.max():>9.2e} {(logp - exact).abs().mean():>9.2e}")


if __name__ == "__main__":
    main()
