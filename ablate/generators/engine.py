"""generator=hf's sampling engine: our own decode loop over a transformers causal LM with a KV cache (CPU or GPU).

Sequences run in waves: a wave is prefilled together (prompts left-padded) and decoded one token per step with its
own cache until every row has ended; several waves may be in flight at once, each at its own position. Between two
decode steps the weights may be replaced (`load`): running rows keep their cache and go on with the new weights,
and every token records the version that sampled it.

A row thinks until it emits `</think>`. Under an interruption budget, a row still thinking after `budget` tokens
gets the phrase's tokens forced in (recorded, masked out of the loss), then at most max_answer_tokens more; without
a budget a row is cut (truncated) at max_think + max_answer sampled tokens. A row ends at an end-of-sequence token.
The decoder computes in `compute_dtype` (autocast: the engine's own copy of the weights is already in it; the
trainer's fp32 policy, sampled for validation, computes as the trainer does). The LM head runs in `head_dtype`
(fp32 when the precision option says so on the generator side), outside autocast; the recorded log-prob is that of
the token under the distribution it was sampled from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ablate.policy import autocast
from ablate.tasks.base import THINK_END


@dataclass
class Sequence:
    """One completion being generated, and everything the trainer needs from it."""

    prompt_index: int  # the task's index of its prompt
    batch: int  # the optimizer step it is for (0: validation)
    prompt_ids: list[int]
    think_budget: int | None = None  # interruption: thinking tokens before the phrase is forced in
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)  # False for forced (injected) tokens
    thinking: bool = True
    interrupted: bool = False
    forced: list[int] = field(default_factory=list)  # tokens still to force in
    answer_tokens: int = 0  # sampled since thinking ended
    done: bool = False
    truncated: bool = False
    tail: str = ""  # the text of its last thinking tokens, where `</think>` is text of several tokens

    @property
    def n_sampled(self) -> int:
        return sum(self.sampled)


@dataclass
class Limits:
    max_think_tokens: int
    max_answer_tokens: int
    stop_ids: tuple[int, ...]  # end-of-sequence token ids
    think_end_id: int | None  # `</think>` as one token; None when the tokenizer has no such token
    phrase_ids: tuple[int, ...] = ()  # the interruption phrase
    # without that token, each id's text: thinking ends where the row's text does `</think>`, whatever tokens spell it
    # (Llama-3: '</', 'think', '>' or '.</', ' </', '>\n\n', ...)
    token_texts: tuple[str, ...] | None = None


TAIL_CHARS = 64  # `</think>` and the longest token text that may end it


def sample(logp: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """One token per row of log-probs [n, V]: Gumbel-max, argmax(log p - log(-log u)) with u ~ U(0, 1), is an exact
    draw from p, and cheaper than torch.multinomial on CPU."""
    uniform = torch.rand(logp.shape, generator=rng, device=logp.device).clamp_(min=1e-20)
    return torch.argmax(logp - torch.log(-torch.log(uniform)), dim=-1)


def append_token(row: Sequence, limits: Limits, version: int, token: int, logprob: float, sampled: bool) -> None:
    """Add one token to `row` and apply the length rules (every engine calls this: the rules are the same)."""
    lim = limits
    row.tokens.append(token)
    row.logprobs.append(logprob)
    row.versions.append(version)
    row.sampled.append(sampled)
    if sampled and token in lim.stop_ids:
        row.done = True
        return
    if row.thinking:
        if lim.token_texts is not None:
            row.tail = (row.tail + (lim.token_texts[token] if token < len(lim.token_texts) else ""))[-TAIL_CHARS:]
        if token == lim.think_end_id or (row.interrupted and not row.forced) or THINK_END in row.tail:
            row.thinking = False
        elif row.think_budget is not None and not row.interrupted and len(row.tokens) >= row.think_budget:
            row.interrupted, row.forced = True, list(lim.phrase_ids)
            if not row.forced:
                row.thinking = False
    elif sampled:
        row.answer_tokens += 1
    cap = lim.max_answer_tokens if row.interrupted and not row.thinking else None
    if (cap is not None and row.answer_tokens >= cap) or \
            (cap is None and row.n_sampled >= lim.max_think_tokens + lim.max_answer_tokens):
        row.done = row.truncated = True


class _Wave:
    def __init__(self, rows: list[Sequence], pad_id: int, device: torch.device):
        self.rows = rows
        width = max(len(r.prompt_ids) for r in rows)
        self.ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
        self.attention = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, r in enumerate(rows):  # left padding
            self.ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=device)
            self.attention[i, width - len(r.prompt_ids):] = 1
        self.cache = DynamicCache()
        self.hidden: torch.Tensor | None = None  # [n, H]: the state that predicts each row's next token

    def __len__(self) -> int:
        return len(self.rows)


class Engine:
    """Decode loop over `model` (its own copy of the weights, or the trainer's for validation)."""

    stages = False  # takes new weights as `load` is given them (engines in processes of their own stage them first)
    receives = False  # its weights come by `load`, never over a process group into it (VLLMEngine's may)
    devices = 1  # decodes on one device

    def __init__(self, model: torch.nn.Module, limits: Limits, *, head_dtype: torch.dtype, temperature: float,
                 pad_id: int, seed: int, version: int = 0, compute_dtype: torch.dtype = torch.float32):
        self.model, self.limits = model, limits
        self.head_dtype, self.compute_dtype = head_dtype, compute_dtype
        self.temperature, self.pad_id = temperature, pad_id
        self.version = version
        self.device = next(model.parameters()).device
        self.params = sum(p.numel() for p in model.parameters())  # weights held on this device
        self.weights_dtype = next(model.parameters()).dtype  # what `load` copies into
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.waves: list[_Wave] = []
        self.decode_steps = 0

    @property
    def running(self) -> int:
        return sum(len(w.rows) for w in self.waves)

    @torch.no_grad()
    def load(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights between decode steps; running rows keep their caches and continue with them. `weights`: a
        state dict, or (name, tensor) pairs taken one at a time as they come (gathered from FSDP shards tensor by
        tensor: ablate/distributed/layouts.py), each copied into the engine's own tensor (in its dtype)."""
        own = self.model.state_dict()
        loaded = set()
        for name, tensor in weights.items() if isinstance(weights, Mapping) else weights:
            own[name].copy_(tensor)
            loaded.add(name)
        if loaded != own.keys():
            missing = sorted(own.keys() - loaded)
            raise ValueError(f"new weights miss {len(missing)} of the engine's tensors: {', '.join(missing[:3])}")
        self.version = version

    def close(self) -> None:
        """Nothing to release: the engine's copy of the weights goes with it (vLLM's engine shuts its core down)."""

    @torch.no_grad()
    def start(self, rows: list[Sequence]) -> None:
        """Prefill a new wave of rows."""
        if rows:
            wave = _Wave(rows, self.pad_id, self.device)
            wave.hidden = self._forward(wave, wave.ids, wave.attention)
            self.waves.append(wave)

    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """One token for every running row; returns the rows that ended (their wave is dropped once all have)."""
        ended: list[Sequence] = []
        for wave in list(self.waves):
            ended.extend(self._step_wave(wave))
            if all(r.done for r in wave.rows):
                self.waves.remove(wave)
        self.decode_steps += 1
        return ended

    def advance(self, steps: int, seconds: float = 0.0) -> list[Sequence]:
        return advance(self, steps, seconds)

    def _step_wave(self, wave: _Wave) -> list[Sequence]:
        logits = self._logits(wave.hidden)
        if not torch.isfinite(logits).all():
            raise FloatingPointError(f"the generator's logits are not finite (weights of version {self.version}): "
                                     "the policy diverged")
        logp = torch.log_softmax(logits, dim=-1)
        choice = sample(logp, self.rng)
        chosen_logp = logp.gather(1, choice[:, None]).squeeze(1)
        choices, chosen = choice.tolist(), chosen_logp.tolist()  # one transfer, not one per row
        next_ids, ended = [], []
        for i, row in enumerate(wave.rows):
            if row.done:
                next_ids.append(self.pad_id)
                continue
            if row.forced:
                token, lp, sampled = row.forced.pop(0), 0.0, False
            else:
                token, lp, sampled = choices[i], chosen[i], True
            self._append(row, token, lp, sampled)
            next_ids.append(token)
            if row.done:
                ended.append(row)
        if not all(r.done for r in wave.rows):
            ids = torch.tensor(next_ids, device=self.device)[:, None]
            alive = torch.tensor([not r.done for r in wave.rows], device=self.device, dtype=torch.long)[:, None]
            wave.attention = torch.cat([wave.attention, alive], dim=1)
            wave.hidden = self._forward(wave, ids, wave.attention)
        return ended

    def _append(self, row: Sequence, token: int, logprob: float, sampled: bool) -> None:
        append_token(row, self.limits, self.version, token, logprob, sampled)

    def _forward(self, wave: _Wave, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        with autocast(self.device, self.compute_dtype):
            out = self.model.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions,
                                           past_key_values=wave.cache, use_cache=True)
        return out.last_hidden_state[:, -1]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.get_output_embeddings()
        logits = hidden.to(self.head_dtype) @ head.weight.to(self.head_dtype).T
        if head.bias is not None:
            logits = logits + head.bias.to(self.head_dtype)
        return logits.float() / self.temperature


def advance(engine, steps: int, seconds: float = 0.0) -> list[Sequence]:
    """Decode steps of `engine` until one in which a wave ended (its last rows), `steps` of them, or (seconds > 0)
    once `seconds` have passed, whichever comes first; the rows that ended. What the pipeline asks of an engine
    between two looks (the points where it may start a wave or load weights): a wave's end is the only event that
    lets it act, so one process decodes as step by step, and an engine process answers once per run of steps
    instead of once per step (docs/design.md#engine-processes)."""
    ended: list[Sequence] = []
    deadline = time.perf_counter() + seconds if seconds > 0 else None
    for _ in range(steps):
        waves = len(engine.waves)
        if not waves:
            break
        ended += engine.step()
        if len(engine.waves) < waves or (deadline is not None and time.perf_counter() >= deadline):
            break
    return ended


def decode(engine, rows: list[Sequence], max_waves: int, wave_rows: int) -> None:
    """Every row to its end on `engine`: waves of `wave_rows` rows, at most `max_waves` of them running (validation)."""
    queue = list(rows)
    while queue or engine.running:
        while queue and len(engine.waves) < max_waves:
            engine.start(queue[:wave_rows])
            del queue[:wave_rows]
        engine.step()
