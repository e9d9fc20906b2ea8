"""generator=hf's engine: the log-probs it records are the trainer's, the length rules, weights swapped mid-flight."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ablate.generators.engine import Engine, Limits, Sequence
from ablate.policy import build_policy, completion_logprobs
from ablate.rl.precision import bf16, fp32_head
from ablate.tasks.tokenizer import build_tokenizer

TOK = build_tokenizer()
MODEL = OmegaConf.create({"path": None, "vocab_size": 0, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                          "dtype": "float32", "device": "cpu"})
PROMPTS = ["reverse 123:", "reverse 98765:", "sum 4:"]


def _rows(budget=None, n=2):
    return [Sequence(i, 1, TOK.encode(p, add_special_tokens=False), think_budget=budget)
            for i, p in enumerate(PROMPTS) for _ in range(n)]


def _limits(think=6, answer=4, phrase="Okay, time is up."):
    return Limits(think, answer, (TOK.eos_token_id,), TOK.convert_tokens_to_ids("</think>"),
                  tuple(TOK.encode(phrase, add_special_tokens=False)))


def _run(engine, rows, load_at=None, new_state=None):
    engine.start(rows[: len(rows) // 2])
    engine.start(rows[len(rows) // 2:])  # two waves in flight, different prompt widths
    while engine.running:
        if engine.decode_steps == load_at:
            engine.load(new_state, engine.version + 1)
        engine.step()
    return rows


def _trainer_logprobs(model, rows, head=fp32_head, temperature=1.0):
    from ablate.generators.pipeline import assemble

    ro = assemble(rows, torch.zeros(len(rows), dtype=torch.bool), list(range(len(rows))), TOK.pad_token_id)
    with torch.no_grad():
        logp = completion_logprobs(model, ro.prompt_tokens, ro.prompt_mask, ro.tokens, ro.lengths, head,
                                   temperature=temperature)
    return ro, logp


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_are_the_trainers_logprobs_of_the_same_tokens(temperature):
    model = build_policy(MODEL, seed=1, tokenizer=TOK)
    engine = Engine(model, _limits(), head_dtype=torch.float32, temperature=temperature, pad_id=0, seed=3)
    rows = _run(engine, _rows())
    ro, logp = _trainer_logprobs(model, rows, temperature=temperature)
    assert ro.mask.sum() > 20
    assert torch.allclose(logp[ro.mask], ro.gen_logprobs[ro.mask], atol=1e-5)


def test_the_bf16_head_on_the_generator_side_gives_bf16_logprobs():
    model = build_policy(MODEL, seed=1, tokenizer=TOK)
    engine = Engine(model, _limits(), head_dtype=torch.bfloat16, temperature=1.0, pad_id=0, seed=3)
    ro, fp32 = _trainer_logprobs(model, _run(engine, _rows()))
    _, low = _trainer_logprobs(model, _rows_from(ro), bf16)
    assert torch.allclose(low[ro.mask], ro.gen_logprobs[ro.mask], atol=1e-5)
    assert not torch.allclose(fp32[ro.mask], ro.gen_logprobs[ro.mask], atol=1e-5)


def _rows_from(ro):
    rows = []
    for i in range(ro.n):
        n = int(ro.lengths[i])
        rows.append(Sequence(0, 1, ro.prompt_tokens[i][ro.prompt_mask[i]].tolist(), tokens=ro.tokens[i, :n].tolist(),
                             sampled=ro.mask[i, :n].tolist(), logprobs=ro.gen_logprobs[i, :n].tolist(),
                             versions=[0] * n))
    return rows


def test_interruption_forces_the_phrase_in_masked_then_caps_the_answer():
    model = build_policy(MODEL, seed=1, tokenizer=TOK)  # random weights: it rambles, never says </think>
    limits = _limits(think=20, answer=3)
    engine = Engine(model, limits, head_dtype=torch.float32, temperature=1.0, pad_id=0, seed=5)
    rows = _run(engine, _rows(budget=4, n=4))
    phrase = list(limits.phrase_ids)
    interrupted = [r for r in rows if r.interrupted]
    assert len(interrupted) >= len(rows) // 2
    for r in interrupted:
        assert r.tokens[4:4 + len(phrase)] == phrase and r.sampled[4:4 + len(phrase)] == [False] * len(phrase)
        assert r.logprobs[4:4 + len(phrase)] == [0.0] * len(phrase)
        assert all(r.sampled[:4]) and all(r.sampled[4 + len(phrase):])
        assert len(r.tokens) - 4 - len(phrase) <= 3  # at most max_answer tokens after the phrase
        assert r.truncated == (len(r.tokens) - 4 - len(phrase) == 3 and r.tokens[-1] != TOK.eos_token_id)


def test_without_a_budget_a_row_is_cut_at_max_think_plus_max_answer():
    model = build_policy(MODEL, seed=1, tokenizer=TOK)
    engine = Engine(model, _limits(think=5, answer=2), head_dtype=torch.float32, temperature=1.0, pad_id=0, seed=5)
    rows = _run(engine, _rows(n=4))
    for r in rows:
        assert r.done and not r.interrupted
        if r.truncated:
            assert len(r.tokens) == 7 and r.tokens[-1] != TOK.eos_token_id
        else:
            assert r.tokens[-1] == TOK.eos_token_id and len(r.tokens) <= 7
    assert any(r.truncated for r in rows)


def test_weights_loaded_mid_flight_reach_running_rows_and_their_versions_change_inside_a_sequence():
    model = build_policy(MODEL, seed=1, tokenizer=TOK)
    other = build_policy(MODEL, seed=2, tokenizer=TOK)
    engine = Engine(build_policy(MODEL, seed=1, tokenizer=TOK), _limits(think=12, answer=4),
                    head_dtype=torch.float32, temperature=1.0, pad_id=0, seed=7)
    rows = _run(engine, _rows(n=3), load_at=3, new_state=other.state_dict())
    long = [r for r in rows if len(r.tokens) > 3]
    assert long and all(r.versions[:3] == [0, 0, 0] and set(r.versions[3:]) == {1} for r in long)
    # Before the load the tokens are the first model's; after it, the second's (on the first one's cache)
    ro, before = _trainer_logprobs(model, long)
    for i, r in enumerate(long):
        assert torch.allclose(before[i, :3], ro.gen_logprobs[i, :3], atol=1e-5)
        assert not torch.allclose(before[i, 3:len(r.tokens)], ro.gen_logprobs[i, 3:len(r.tokens)], atol=1e-3)


def test_sampling_draws_tokens_with_their_probabilities():
    from ablate.generators.engine import sample

    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    draws = sample(p.log().expand(100_000, 5), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    assert torch.allclose(freq, p, atol=0.006)  # 4 sd of a binomial at p = 0.5 and n = 1e5 is 0.0063
    assert freq[4] == 0  # a token of probability 0 is never drawn
