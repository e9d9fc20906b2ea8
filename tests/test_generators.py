"""The generator contract (ablate/generators/base.py): every option implements it, the config checks and the trainer
read capabilities through it, and what a generator has no use for comes from it rather than being written again."""

from __future__ import annotations

import pytest

from ablate.compute import ReferenceClock, WallClock
from ablate.checks import check_run
from ablate.config import compose
from ablate.generators.base import Capabilities, Generator, capabilities
from ablate.generators.mock import MockGenerator, SimulatedClock
from ablate.generators.pipelined import PipelineGenerator
from ablate.registry import build
from ablate.trainer import PromptSampler


@pytest.mark.parametrize("option, expected", [
    ("hf", Capabilities(samples_policy=True, engine_processes=True)),
    ("vllm", Capabilities(samples_policy=True, engine_processes=True, beside_trainer_ranks=False)),
    ("mock", Capabilities(samples_policy=False, engine_processes=False)),
])
def test_every_generator_option_declares_its_capabilities_through_the_contract(option, expected):
    assert capabilities(compose([f"generator={option}"]).generator) == expected


def test_a_target_that_does_not_implement_the_contract_is_named():
    with pytest.raises(TypeError, match=r"generator=odd: ablate.trainer.PromptSampler does not implement "
                                        r"ablate.generators.base.Generator"):
        capabilities({"name": "odd", "_target_": "ablate.trainer.PromptSampler"})


def test_engine_processes_are_refused_for_a_generator_that_has_none():
    cfg = compose(["generator=mock", "run.generator_gpus=1"])
    with pytest.raises(ValueError, match="generator=mock has no engine that runs in a process of its own"):
        check_run(cfg)
    check_run(compose(["generator=hf", "run.generator_gpus=1"]))  # hf has


def test_vllm_in_rank_0_beside_other_trainer_ranks_fails_before_submit_in_one_line():
    """run=fsdp generator=vllm run.generator_gpus=0 hung: vLLM in rank 0 made its groups over every trainer rank while
    the others waited for rank 0's next call. Now refused before anything runs; with engine processes it is allowed."""
    with pytest.raises(ValueError, match=r"^generator=vllm with run.trainer_gpus=2 and run.generator_gpus=0: its "
                                         r"engine cannot share trainer rank 0's process .* run.generator_gpus >= 1$"):
        check_run(compose(["generator=vllm", "run=fsdp"]))
    check_run(compose(["generator=vllm", "run=fsdp", "run.generator_gpus=1"]))
    check_run(compose(["generator=hf", "run=fsdp"]))  # our engine in rank 0 beside FSDP ranks works


def test_the_mock_takes_what_it_has_no_use_for_from_the_contract():
    """No weights, no engine, no perf figures: the contract's no-ops, not copies of them."""
    for method in ("publish", "reset_weights", "perf", "close", "paused"):
        assert getattr(MockGenerator, method) is getattr(Generator, method), method
    assert "publish" not in vars(MockGenerator)


def _built(*overrides: str):
    from ablate.policy import build_policy, build_tokenizer

    cfg = compose(["task.n_train_prompts=16", "task.n_val_prompts=4", *overrides])
    tok = build_tokenizer(cfg.model)
    task = build(cfg.task, tokenizer=tok, seed=cfg.seed)
    sampler = PromptSampler(task.size("train"), cfg.seed, build(cfg.filtering))
    return build(cfg.generator, cfg=cfg, task=task, sampler=sampler, policy=build_policy(cfg.model, cfg.seed, tok))


def test_the_run_clock_is_the_generators_and_the_config_picks_it():
    """Compute accounting lives in ablate/compute.py: wall-clock device-hours, or FLOPs at a reference throughput
    (train.reference_tflops), or the mock's simulated budget."""
    wall = _built("generator=hf", "train.reference_tflops=0")
    assert isinstance(wall, PipelineGenerator) and isinstance(wall.clock, WallClock)
    assert wall.clock.gpu_hours(1, None, wall_seconds=7200.0, flops=None) == pytest.approx(2.0 * wall.clock.devices)
    wall.close()
    reference = _built("generator=hf", "train.reference_tflops=1")
    assert isinstance(reference.clock, ReferenceClock)
    reference.close()
    assert isinstance(_built("generator=mock").clock, SimulatedClock)


def test_each_clock_counts_the_wait_of_a_step_dropped_at_the_warning():
    """A step dropped at SLURM's warning after half an hour of waiting on its rollouts (docs/training.md#time-limits):
    the wall clock counts every device the job holds for that half hour (8 x 0.5 h); the reference clock, which
    counts the work of the batches trained and never the wall clock, nothing; the mock's clock that wait's share of
    the generator.step_seconds its rollouts are played in, of a step at the reference length (1,000 GPU-hours over
    10 steps, 1 s of 4: 25; never more than the step), and nothing where rollouts come at once."""
    from ablate.offpolicy import PipelineRL

    assert WallClock(8).dropped(1800.0) == pytest.approx(4.0)
    assert ReferenceClock(1.0, [4, 4], PipelineRL(8)).dropped(1800.0) == 0.0
    paced = _built("generator=mock", "generator.gpu_hours=1000", "train.steps=10", "generator.step_seconds=4")
    assert paced.clock.dropped(1.0) == pytest.approx(25.0) and paced.clock.dropped(60.0) == pytest.approx(100.0)
    paced.step_seconds = 2.0  # what tests that pace a single step set: the clock's own
    assert paced.clock.dropped(1.0) == pytest.approx(50.0)
    assert _built("generator=mock", "generator.gpu_hours=1000", "train.steps=10").clock.dropped(1.0) == 0.0


def test_tensor_parallel_replies_are_compared_on_what_they_decided_not_on_their_clocks():
    """An engine's tensor-parallel processes must decide the same (tokens, waves, steps); each times its own advance
    (the pace rank 0 sets the concurrent mode's looks by), and those seconds differ from process to process: the
    vLLM lane's tensor-parallel runs failed "answered advance differently" on them until they were left out."""
    from ablate.generators.engine import Sequence
    from ablate.generators.remote import _outcome

    row = Sequence(0, 1, [5, 6])
    row.tokens = [7, 8, 9]
    one, other = ([(3, row)], [4, 2], 17, 0.010), ([(3, row)], [4, 2], 17, 0.013)
    assert _outcome(one) == _outcome(other) == [(3, [7, 8, 9]), [4, 2], 17]
    assert _outcome(one) != _outcome(([(3, row)], [4, 2], 16, 0.010))  # another step count is another decision
