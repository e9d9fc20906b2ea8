"""The trainer path: every option of every axis, selected by config alone, runs real optimizer steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from ablate.config import compose
from ablate.registry import build
from ablate.trainer import Learner

CONF = Path(__file__).resolve().parents[1] / "conf"
pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
AXES = ["loss", "aggregation", "normalization", "precision", "length_control", "off_policy", "filtering"]
AXIS_OPTIONS = [(g, f.stem) for g in AXES for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", AXIS_OPTIONS, ids=[f"{g}={o}" for g, o in AXIS_OPTIONS])
def test_every_axis_option_runs_two_optimizer_steps(group, option):
    cfg = OmegaConf.create(OmegaConf.to_container(compose([f"{group}={option}"]), resolve=True, enum_to_str=True))
    generator, learner = build(cfg.generator, cfg=cfg), Learner(cfg)
    prompt_filter, length_control = build(cfg.filtering), build(cfg.length_control)
    before = [p.detach().clone() for p in learner.policy.parameters()]
    for step in range(2):
        ro = generator.rollouts(list(range(8)), step, compute=1000.0 * step)
        rewards = ro.rewards + length_control.reward_shaping(ro.lengths, 48)
        keep = prompt_filter.keep(rewards, ro.group)
        if not keep.any():  # a batch with nothing to learn from: make one prompt's rewards differ
            rewards[0] = 1.0 - rewards[0]
            keep = prompt_filter.keep(rewards, ro.group)
        metrics = learner.step(ro, rewards, keep)
        assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    after = list(learner.policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the optimizer did not move the policy"
    assert learner.optimizer.state and len(learner.optimizer.state) == len(after)


def test_the_learner_calls_the_configured_functions():
    cfg = OmegaConf.create(OmegaConf.to_container(
        compose(["loss=gspo", "aggregation=token_mean", "normalization=none", "precision=bf16"]), resolve=True))
    learner = Learner(cfg)
    names = {f.func.__name__ for f in (learner.loss, learner.aggregate, learner.normalize, learner.head)}
    assert names == {"gspo", "token_mean", "none", "bf16"}
    assert learner.loss.keywords == {"eps_low": 3e-3, "eps_high": 5e-3}


def test_micro_batching_in_the_learner_gives_the_whole_batch_gradient():
    cfg = OmegaConf.create(OmegaConf.to_container(compose([]), resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3  # every prompt has reward variance
    grads = []
    for micro in (ro.n, 5):  # the whole batch at once; micro-batches of 5 that split prompts
        learner = Learner(cfg)  # the same seed: the same initial policy
        learner.micro_batch = micro
        learner.optimizer.step = lambda: None  # keep the gradient to compare it
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        learner.step(ro, rewards, torch.ones(ro.n, dtype=torch.bool))
        grads.append(torch.cat([p.grad.flatten() for p in learner.policy.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-8)
