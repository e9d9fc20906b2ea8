"""The vLLM engine (ablate/generators/vllm_engine.py) on a real GPU: a tiny random Llama with our code-made
tokenizer, saved to disk and served by vLLM in this process. Needs CUDA and the vllm extra
(`pip install -e '.[vllm]'`); run with `pytest tests/test_vllm.py -m gpu` (the default run deselects gpu tests)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ablate.generators.engine import Limits, Sequence
from ablate.generators.vllm_engine import VLLMEngine
from ablate.policy import build_policy, completion_logprobs
from ablate.rl.precision import fp32_head
from ablate.tasks.tokenizer import build_tokenizer

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device: vLLM runs on CUDA only", allow_module_level=True)
pytest.importorskip("vllm", reason="vllm is not importable: install the extra, pip install -e '.[vllm]'")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One engine for the module (vLLM starts in tens of seconds): each test sets its limits and leaves the
    original weights loaded at version 0."""
    tok = build_tokenizer()
    policy = build_policy(OmegaConf.create({"path": None, "vocab_size": len(tok), "hidden_size": 64,
                                            "num_layers": 2, "num_heads": 4, "dtype": "bfloat16"})).cuda().eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    policy.save_pretrained(path)
    tok.save_pretrained(path)
    engine = VLLMEngine(str(path), Limits(8, 8, (tok.eos_token_id,), None), head_dtype=torch.float32,
                        temperature=1.0, pad_id=tok.pad_token_id, seed=0, gpu_memory_utilization=0.3,
                        max_model_len=512)
    yield tok, policy, engine
    engine.close()


def prompts(tok) -> list[list[int]]:
    """Three different prompts of 49 tokens (three full KV blocks of 16: prefix-cacheable)."""
    return [tok.encode(f"{task} " + " ".join(str(i * k % 10) for i in range(24)), add_special_tokens=False)
            for task, k in (("reverse", 1), ("sort", 3), ("sum", 7))]


def run(engine: VLLMEngine, rows: list[Sequence]) -> None:
    engine.start(rows)
    ended = []
    while engine.running:
        ended += engine.step()
    assert sorted(map(id, ended)) == sorted(map(id, rows)) and all(r.done for r in rows)


def reference(policy, rows: list[Sequence], pad_id: int) -> torch.Tensor:
    """[N, T] log-probs of the rows' tokens under the torch policy with the FP32 head."""
    P, T = max(len(r.prompt_ids) for r in rows), max(len(r.tokens) for r in rows)
    prompt = torch.full((len(rows), P), pad_id)
    mask = torch.zeros((len(rows), P), dtype=torch.bool)
    tokens = torch.full((len(rows), T), pad_id)
    for i, r in enumerate(rows):
        prompt[i, P - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        mask[i, P - len(r.prompt_ids):] = True
        tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
    lengths = torch.tensor([len(r.tokens) for r in rows])
    with torch.no_grad():
        return completion_logprobs(policy, prompt.cuda(), mask.cuda(), tokens.cuda(), lengths.cuda(), fp32_head).cpu()


def test_rows_end_at_version_0_with_the_torch_fp32_head_logprobs(setup):
    tok, policy, engine = setup
    engine.limits = Limits(8, 8, (tok.eos_token_id,), tok.convert_tokens_to_ids("</think>"))
    rows = [Sequence(i, 1, ids) for i, ids in enumerate(prompts(tok)) for _ in range(2)]
    run(engine, rows)
    ref = reference(policy, rows, tok.pad_token_id)
    for i, r in enumerate(rows):
        assert 0 < len(r.tokens) <= 16 and set(r.versions) == {0} and all(r.sampled)
        assert len(r.logprobs) == len(r.versions) == len(r.sampled) == len(r.tokens)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref[i, :len(r.tokens)], atol=2e-2, rtol=0)


def test_load_mid_generation_keeps_running_rows_and_no_stale_prefix(setup):
    tok, policy, engine = setup
    engine.limits = Limits(6, 6, (), None)  # no stop: every row is exactly 12 tokens
    original = {name: t.detach().clone() for name, t in policy.state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    noisy = {name: t + 0.2 * torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) if t.dim() == 2
             else t for name, t in original.items()}  # a very different model
    try:
        first = [Sequence(i, 1, ids) for i, ids in enumerate(prompts(tok))]
        engine.start(first)
        for _ in range(4):
            assert engine.step() == []
        engine.load(noisy, version=1)
        assert engine.running == len(first) and engine.version == 1
        # The same prompts again, while `first` still runs: their blocks cached under version 0 must not be used.
        second = [Sequence(i, 2, ids) for i, ids in enumerate(prompts(tok))]
        engine.start(second)
        while engine.running:
            engine.step()
        for r in first:
            assert r.versions == [0] * 4 + [1] * 8 and r.truncated
        policy.load_state_dict(noisy)
        ref = reference(policy, second, tok.pad_token_id)
        for i, r in enumerate(second):
            assert r.versions == [1] * 12
            torch.testing.assert_close(torch.tensor(r.logprobs), ref[i], atol=0.1, rtol=0)
    finally:
        policy.load_state_dict(original)
        engine.load(original, version=0)


def test_interruption_forces_the_phrase_in_masked(setup):
    tok, policy, engine = setup
    phrase = tuple(tok.encode(" Okay, time is up.", add_special_tokens=False))
    n = len(phrase)
    engine.limits = Limits(50, 3, (), None, phrase)  # no </think>: every row thinks until its budget of 2
    rows = [Sequence(i, 1, ids, think_budget=2) for i, ids in enumerate(prompts(tok))]
    run(engine, rows)
    ref = reference(policy, rows, tok.pad_token_id)
    for i, r in enumerate(rows):
        assert r.tokens[2:2 + n] == list(phrase) and r.logprobs[2:2 + n] == [0.0] * n
        assert r.sampled == [True] * 2 + [False] * n + [True] * 3 and set(r.versions) == {0}
        assert r.interrupted and not r.thinking and r.truncated and r.answer_tokens == 3
        sampled = torch.tensor(r.sampled)  # the answer continues after the phrase, from a re-added request
        torch.testing.assert_close(torch.tensor(r.logprobs)[sampled], ref[i, :len(r.tokens)][sampled], atol=2e-2,
                                   rtol=0)
