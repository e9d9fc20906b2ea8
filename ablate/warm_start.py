"""The supervised warm start a task includes (the paper starts RL from an SFT model): next-token cross-entropy on
the completions of the task's warm-start examples, each ended by the end of a turn in the tokenizer's chat format
(its eos without one), `steps` AdamW steps of `batch_size` examples.

Every variant of a sweep starts from the same warm-started weights: they are cached on disk under a key made of the
model's and the task's configs and the seed, written atomically under a file lock, so variants starting together
wait for the first to make it and load it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import torch

from ablate.policy import autocast, end_of_turn_id


def warm_start(policy: torch.nn.Module, task, *, steps: int, lr: float, batch_size: int,
               compute_dtype: torch.dtype = torch.float32) -> list[float]:
    """Train `policy` in place on the task's warm-start examples (a fixed stream: nothing here is random); returns
    the loss of each step. Its weights stay fp32; the forward computes in `compute_dtype` (as RL will)."""
    tok = task.tokenizer
    end = end_of_turn_id(tok)  # the answer ends as a turn of the model's chat format ends, else at its eos
    end = tok.eos_token_id if end is None else end
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    device = next(policy.parameters()).device
    losses, drawn = [], 0
    policy.train()
    for _ in range(steps):
        rows, labels = [], []
        for _ in range(batch_size):
            example = task.warm_start_example(drawn)
            drawn += 1
            prompt = task.encode_prompt(example[0])  # as RL will prompt it
            completion = tok.encode(example[1], add_special_tokens=False) + [end]
            rows.append(prompt + completion)
            labels.append([-100] * len(prompt) + completion)
        width = max(map(len, rows))
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], device=device)
        target = torch.tensor([r + [-100] * (width - len(r)) for r in labels], device=device)
        attention = (torch.arange(width, device=device)[None, :] < torch.tensor([len(r) for r in rows],
                                                                                device=device)[:, None]).long()
        with autocast(device, compute_dtype):
            loss = policy(input_ids=ids, attention_mask=attention, labels=target).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def cached_warm_start(policy: torch.nn.Module, task, folder: Path | None, key: dict, **kwargs) -> bool:
    """warm_start, or load its result from `folder` when an identical one was made before. True when loaded."""
    if folder is None:
        warm_start(policy, task, **kwargs)
        return False
    digest = hashlib.sha256(json.dumps({**key, **kwargs}, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(folder) / f"warm_start-{digest}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:  # jobs starting together: one trains, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            policy.load_state_dict(torch.load(path, map_location=next(policy.parameters()).device,
                                               weights_only=True))
            return True
        warm_start(policy, task, **kwargs)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(policy.state_dict(), tmp)
        tmp.replace(path)
    return False
