"""The learner on FSDP2 over 2 ranks (gloo, CPU) against the learner in one process: the same step.

The ranks are real processes (torch.multiprocessing, a gloo process group through a file), each holding half of
every weight (fully_shard per decoder layer) and training half of the rows; the loss and the gradient must be the
whole batch's, as one process computes them. Also here: the rows are really split (a rank-local aggregation, which
FSDP's default average would give, is measurably different), and the fp32 master weights move at the paper's lr
with bf16 compute.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from ablate import processes, tracking
from ablate.distributed import groups as process_groups
from ablate.distributed import signals, topology
from ablate.config import compose
from ablate.generators.engine import Engine, Limits, Sequence, decode
from ablate.policy import build_policy, weights_in
from ablate.registry import build
from ablate.rl.aggregation import token_weights
from ablate.trainer import Learner
from conftest import ROOT, run_cli, spawn_ranks


def deal(lengths: torch.Tensor, trained: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """A split of the rows into disjoint shares, one a rank: the retired plan's round-robin deal (bench/
    retired_plan.py), loaded from its file; the tests below need a split, not the learner's plan."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("retired_plan", ROOT / "bench" / "retired_plan.py")
    retired = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(retired)
    return retired.deal(lengths, trained, rank, world)

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
WORLD = 2


def _config(*overrides: str):
    # prompt_mean + batch normalization (ScaleRL's): neither is a rank-local average
    # model.device=cpu: gloo ranks on the CPU, on a GPU machine too
    return OmegaConf.to_container(compose(["generator=mock", "train.micro_batch_size=3", "model.device=cpu",
                                           *overrides]), resolve=True, enum_to_str=True)


def _batch(cfg, prompts=range(4)):
    ro = build(cfg.generator, cfg=cfg).rollouts(list(prompts), 0, compute=2000.0)
    rewards = (torch.arange(ro.n) % 3 == 0).float()  # every prompt has reward variance
    return ro, rewards, torch.ones(ro.n, dtype=torch.bool)


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _step(cfg, ranks=None) -> dict:
    """One Learner step: its metrics, the summed gradient and the weights before and after."""
    learner = Learner(cfg, ranks=ranks)
    before = {n: _full(p) for n, p in learner.policy.named_parameters()}
    grads, real_step = {}, learner.optimizer.step

    def step_and_keep(*args, **kwargs):
        grads.update({n: _full(p.grad) for n, p in learner.policy.named_parameters() if p.grad is not None})
        return real_step(*args, **kwargs)

    learner.optimizer.step = step_and_keep
    held = []  # gradient bytes held at the start of every pass (after the one before) and before the update
    learner.scorer.register_forward_pre_hook(lambda *_: held.append(learner.ranks.gradient_bytes(learner.scorer)))
    learner.optimizer.register_step_pre_hook(lambda *_: held.append(learner.ranks.gradient_bytes(learner.scorer)))
    layer = learner.policy.get_decoder().layers[0]
    seen = set()  # the dtypes of the residual stream (a decoder layer's output) and of a norm's output
    layer.register_forward_hook(lambda m, i, o: seen.add(("residual", (o[0] if isinstance(o, tuple) else o).dtype)))
    layer.input_layernorm.register_forward_hook(lambda m, i, o: seen.add(("norm", o.dtype)))
    metrics = learner.step(*_batch(cfg))
    after = {n: _full(p) for n, p in learner.policy.named_parameters()}
    dtypes = {str(p.dtype) for p in learner.policy.parameters()}
    kinds = {type(p.data).__name__ for p in learner.policy.parameters()}
    return {"metrics": metrics, "grads": grads, "before": before, "after": after, "dtypes": dtypes, "kinds": kinds,
            "gradient_bytes": held, "computed_in": seen, "params": sum(w.numel() for w in before.values())}


def _resumed(cfg, ranks, folder: Path) -> dict:
    """Step 1, checkpoint, step 2; and a learner from other initial weights that loads the checkpoint, step 2."""
    first, second = _batch(cfg), _batch(cfg, prompts=range(4, 8))
    learner = Learner(cfg, ranks=ranks)
    learner.step(*first)
    payload = ranks.save(learner, folder, tag=1)
    ranks.prune(folder, payload)
    learner.step(*second)
    other = OmegaConf.merge(cfg, {"seed": cfg.seed + 1})
    resumed = Learner(other, ranks=ranks)
    changed_start = any(not torch.equal(_full(a), _full(b)) for a, b in
                        zip(learner.policy.parameters(), resumed.policy.parameters()))
    ranks.load(resumed, payload, folder)
    resumed.step(*second)
    return {"payload": payload, "changed_start": changed_start,
            "straight": {n: _full(p) for n, p in learner.policy.named_parameters()},
            "resumed": {n: _full(p) for n, p in resumed.policy.named_parameters()},
            "lr": (learner.scheduler.get_last_lr(), resumed.scheduler.get_last_lr()),
            "folders": sorted(p.name for p in folder.iterdir())}


def _checksums(named) -> dict[str, str]:
    return {name: hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest() for name, t in named}


def _synced(cfg, ranks) -> dict:
    """A step on the ranks, then the weight path to a generator engine holding its own copy (other weights):
    gathered tensor by tensor on every rank, loaded by rank 0's engine. Checksums of both sides, per tensor."""
    learner = Learner(cfg, ranks=ranks)
    learner.step(*_batch(cfg))
    copy = build_policy(cfg.model, cfg.seed + 1)
    engine = Engine(copy, Limits(4, 4, (0,), None), head_dtype=torch.float32, temperature=1.0, pad_id=0, seed=0)
    before = _checksums(copy.state_dict().items())
    if ranks.rank == 0:
        engine.load(ranks.weights(learner.policy), version=1)
    else:
        for _ in ranks.weights(learner.policy):  # every rank takes part in each gather
            pass
    trainer = _checksums((n, _full(p)) for n, p in learner.policy.state_dict().items())
    return {"trainer": trainer, "engine_before": before, "engine": _checksums(copy.state_dict().items()),
            "version": engine.version}


def _rank(rank: int, init_file: str, configs: list, out: str) -> None:
    import torch.distributed as dist

    from ablate.distributed.layouts import FSDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ranks = FSDP()
        results = [_step(OmegaConf.create(c), ranks=ranks) for c in configs]
        results.append(_step(OmegaConf.create(configs[1]), ranks=FSDP(sharded_gradients=False)))
        resumed = _resumed(OmegaConf.create(configs[0]), ranks, Path(out).parent / "checkpoint")
        synced = _synced(OmegaConf.create(configs[0]), ranks)
        if rank == 0:
            torch.save({"steps": results, "resumed": resumed, "synced": synced}, out)
        dist.barrier()  # neither rank tears the group down while the other may still be in it
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The FSDP step on 2 ranks for each config: fp32 compute at a visible lr, bf16 compute at the paper's, the same
    with activation checkpointing (paper_8b's); then bf16 with the gradients accumulated whole (last)."""
    folder = tmp_path_factory.mktemp("fsdp")
    configs = [_config("optim.lr=1e-3"), _config("model.dtype=bfloat16", "optim.lr=5e-7"),
               _config("model.dtype=bfloat16", "optim.lr=5e-7", "train.activation_checkpointing=true")]
    out = torch.load(spawn_ranks(_rank, folder, configs, nprocs=WORLD) / "out", weights_only=False)
    return configs, out["steps"], out["resumed"], out["synced"]


def test_two_fsdp_ranks_take_the_same_step_as_one_process(two_ranks):
    configs, results, *_ = two_ranks
    fsdp = results[0]
    one = _step(OmegaConf.create(configs[0]))
    assert fsdp["kinds"] == {"DTensor"} and one["kinds"] == {"Tensor"}  # really sharded
    assert fsdp["metrics"]["loss/policy"] == pytest.approx(one["metrics"]["loss/policy"], rel=1e-5, abs=1e-7)
    assert fsdp["metrics"]["train/adv_abs_mean"] == pytest.approx(one["metrics"]["train/adv_abs_mean"])
    # the whole batch's mean over its tokens, not the mean of the ranks' means
    assert fsdp["metrics"]["train/logprob_gap"] == pytest.approx(one["metrics"]["train/logprob_gap"], rel=1e-5)
    assert fsdp["grads"].keys() == one["grads"].keys()
    for name, g in one["grads"].items():
        torch.testing.assert_close(fsdp["grads"][name], g, rtol=1e-4, atol=1e-7, msg=name)
    lr = configs[0]["optim"]["lr"]
    moved = 0
    for name, w in one["after"].items():
        update, fsdp_update = w - one["before"][name], fsdp["after"][name] - fsdp["before"][name]
        torch.testing.assert_close(fsdp["before"][name], one["before"][name], rtol=0, atol=0)  # the same start
        # AdamW's first step is about lr * sign(g): the same step wherever the gradient is not at rounding level
        assert (fsdp_update - update).abs().max() <= 1e-2 * lr, name
        moved += int((update != 0).sum())
    assert moved > 0.5 * sum(w.numel() for w in one["after"].values())


def test_the_split_is_real_a_rank_local_aggregation_would_differ(two_ranks):
    """What the FSDP test would not catch if the rows were not split, or split but averaged rank-locally: the
    ranks' rows are disjoint halves, and the gradient of a rank-local prompt_mean (averaged over the ranks, FSDP's
    default) differs from the whole batch's by far more than the test's tolerance."""
    configs, *_ = two_ranks
    cfg = OmegaConf.create(configs[0])
    ro, rewards, keep = _batch(cfg)
    lengths = ro.prompt_mask.sum(1) + ro.lengths
    shares = [deal(lengths, ro.mask.any(1), r, WORLD) for r in range(WORLD)]
    assert not (shares[0] & shares[1]).any() and (shares[0] | shares[1]).equal(ro.mask.any(1))

    learner = Learner(cfg)
    whole = token_weights(learner.aggregate, ro.mask, ro.group)
    local = sum(token_weights(learner.aggregate, ro.mask & s[:, None], ro.group) for s in shares) / WORLD
    assert torch.allclose(whole.sum(), torch.tensor(1.0)) and torch.allclose(local.sum(), torch.tensor(1.0))
    assert (local - whole).abs().max() > 100 * 1e-4 * whole.abs().max()


def test_fp32_master_weights_move_at_the_papers_lr_with_bf16_compute(two_ranks):
    configs, results, *_ = two_ranks
    fsdp = results[1]
    assert configs[1]["model"]["dtype"] == "bfloat16" and configs[1]["optim"]["lr"] == 5e-7
    assert fsdp["dtypes"] == {"torch.float32"}  # the masters (the layers are gathered in bf16 for compute)
    changed = sum(int((fsdp["after"][n] != w).sum()) for n, w in fsdp["before"].items())
    total = sum(w.numel() for w in fsdp["before"].values())
    assert changed > 0.5 * total, f"{changed} of {total} weights moved"
    one = _step(OmegaConf.create(configs[1]))  # one process, autocast bf16: the same loss to bf16's precision
    assert fsdp["metrics"]["loss/policy"] == pytest.approx(one["metrics"]["loss/policy"], rel=5e-3, abs=1e-5)


def test_fsdp_computes_in_bf16_as_one_process_does_residual_stream_and_norms_in_fp32(two_ranks):
    """bf16 compute on 2 FSDP ranks and in one process (autocast): the residual stream between decoder layers and
    the norms' outputs in the same dtype (fp32: FSDP2's default casts a layer's inputs and gathers its norms in
    bf16), and the same loss and gradients to bf16's precision."""
    configs, results, *_ = two_ranks
    fsdp, one = results[1], _step(OmegaConf.create(configs[1]))
    assert one["computed_in"] == {("residual", torch.float32), ("norm", torch.float32)}
    assert fsdp["computed_in"] == one["computed_in"]
    assert fsdp["metrics"]["loss/policy"] == pytest.approx(one["metrics"]["loss/policy"], rel=1e-3, abs=1e-6)
    assert fsdp["grads"].keys() == one["grads"].keys()
    for name, g in one["grads"].items():  # a bf16 tolerance: 2^-8 of the gradient's size
        assert (fsdp["grads"][name] - g).norm() <= 2 ** -8 * g.norm() + 1e-9, name


def test_fsdp_with_activation_checkpointing_takes_the_one_process_step_in_bf16(two_ranks):
    """paper_8b's trainer: FSDP ranks in bf16 with every decoder layer recomputed in the backward (each layer's
    norms a shard group of their own inside it) against one process with the same: the same loss and gradients to
    bf16's precision."""
    configs, results, *_ = two_ranks
    fsdp, one = results[2], _step(OmegaConf.create(configs[2]))
    assert fsdp["metrics"]["loss/policy"] == pytest.approx(one["metrics"]["loss/policy"], rel=1e-3, abs=1e-6)
    for name, g in one["grads"].items():
        assert (fsdp["grads"][name] - g).norm() <= 2 ** -8 * g.norm() + 1e-9, name


def test_accumulated_gradients_stay_sharded_so_a_rank_holds_its_share(two_ranks):
    """Gradient accumulation over a step's passes (11 micro-batches a rank here, bf16 compute): with
    run.sharded_gradients (the default) a rank holds its shard of the fp32 gradient, 4N / 2 bytes, between passes;
    accumulated whole (FSDP2's no-sync) it holds 4N, a whole fp32 gradient (32 GB at 8B)."""
    _, results, *_ = two_ranks
    sharded, whole = results[1], results[-1]
    full = 4 * sharded["params"]
    assert len(sharded["gradient_bytes"]) >= 4  # several passes, then the update
    assert max(sharded["gradient_bytes"]) <= full / WORLD * 1.01
    assert max(whole["gradient_bytes"]) >= full * 0.99
    assert whole["metrics"]["loss/policy"] == pytest.approx(sharded["metrics"]["loss/policy"], rel=1e-6)
    for name, g in sharded["grads"].items():  # the same sum, reduced per pass or once
        torch.testing.assert_close(whole["grads"][name], g, rtol=1e-5, atol=1e-9, msg=name)


def test_a_sharded_checkpoint_resumes_the_same_run(two_ranks):
    """DCP: both ranks write their shards; a learner started from other weights loads them and takes the same
    next step as the learner that never stopped (weights, AdamW's moments and step count, the lr schedule)."""
    _, _, resumed, _ = two_ranks
    assert resumed["payload"]["learner_shards"] == "learner-1" and "policy" not in resumed["payload"]
    assert resumed["folders"] == ["learner-1"]  # complete, renamed, no staging folder left
    assert resumed["changed_start"]  # the resumed learner really started elsewhere
    assert resumed["lr"][0] == resumed["lr"][1]
    for name, w in resumed["straight"].items():
        torch.testing.assert_close(resumed["resumed"][name], w, rtol=0, atol=0, msg=name)


def test_after_a_sync_the_engine_holds_the_trainers_full_weights(two_ranks):
    """The weight path on CPU: every tensor the engine holds has the checksum of the trainer's full tensor."""
    *_, synced = two_ranks
    assert synced["engine"].keys() == synced["trainer"].keys()
    assert synced["engine_before"] != synced["trainer"]  # the engine started from other weights
    different = [n for n, digest in synced["engine"].items() if digest != synced["trainer"][n]]
    assert not different and synced["version"] == 1


def _rank_tied(rank: int, init_file: str, config: dict, out: str) -> None:
    """A tied model (its LM head is its embedding matrix) on 2 FSDP ranks: a step, a checkpoint resumed, a sync."""
    import torch.distributed as dist

    from ablate.distributed.layouts import FSDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ranks, cfg = FSDP(), OmegaConf.create(config)
        step = _step(cfg, ranks=ranks)
        learner = Learner(cfg, ranks=ranks)
        tied = learner.policy.get_output_embeddings().weight is learner.policy.get_input_embeddings().weight
        found = {"step": step, "tied": tied, "resumed": _resumed(cfg, ranks, Path(out).parent / "checkpoint"),
                 "synced": _synced(cfg, ranks)}
        if rank == 0:
            torch.save(found, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tied_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tied")
    config = _config("model.tie_embeddings=true", "optim.lr=1e-3")
    return OmegaConf.create(config), torch.load(spawn_ranks(_rank_tied, folder, config, nprocs=WORLD) / "out",
                                                weights_only=False)


@pytest.mark.e2e
def test_a_tied_model_stays_tied_through_fsdp_its_checkpoint_and_the_weight_stream(tied_ranks):
    """Qwen3 0.6B-4B tie their LM head to their embeddings. On 2 FSDP ranks the tie holds (one tensor), the step is
    one process's, a resumed learner takes the same next step, and an engine (tied too) gets every tensor, its head
    the trainer's embedding. Before, no tied model went through any of it."""
    cfg, found = tied_ranks
    assert found["tied"]
    one = _step(cfg)
    assert found["step"]["after"].keys() == one["after"].keys()
    for name, w in one["after"].items():
        torch.testing.assert_close(found["step"]["after"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    resumed = found["resumed"]
    for name, w in resumed["straight"].items():
        torch.testing.assert_close(resumed["resumed"][name], w, rtol=0, atol=0, msg=name)
    synced = found["synced"]
    assert synced["engine"] == synced["trainer"] != synced["engine_before"]
    assert synced["engine"]["lm_head.weight"] == synced["engine"]["model.embed_tokens.weight"]


def test_an_engine_refuses_weights_that_miss_a_tensor():
    cfg = OmegaConf.create(_config())
    engine = Engine(build_policy(cfg.model, 0), Limits(4, 4, (0,), None), head_dtype=torch.float32,
                    temperature=1.0, pad_id=0, seed=0)
    pairs = [(n, t) for n, t in build_policy(cfg.model, 1).state_dict().items() if n != "lm_head.weight"]
    with pytest.raises(ValueError, match="miss 1 of the engine's tensors: lm_head.weight"):
        engine.load(iter(pairs), version=1)


def _engine_processes(rank: int, init_file: str, engines: int, out: str) -> None:
    """Rank 0: a trainer whose engines are in ranks 1.. (RemoteEngine), beside the same engines in its own process
    (Engine, one per engine process, seeded and dealt rows as those are); ranks 1..: those processes (`serve`)."""
    import torch.distributed as dist

    from ablate.generators import remote

    torch.set_num_threads(1)
    # no torch.distributed world: rank 0 and the engine processes meet in their own groups, through a store
    groups = process_groups.connect(dist.FileStore(init_file, 1 + engines), rank, trainers=1, engines=engines,
                                    backend="gloo")
    if rank > 0:
        remote.serve(groups)
        groups.shutdown()
    else:
        cfg = OmegaConf.create(_config("model.dtype=bfloat16"))
        limits = Limits(6, 4, (0,), None)
        args = {"head_dtype": torch.float32, "temperature": 1.0, "pad_id": 0, "compute_dtype": torch.bfloat16}
        policy = build_policy(cfg.model, cfg.seed)
        there = remote.RemoteEngine(OmegaConf.to_container(cfg.model), limits, policy.state_dict(), groups=groups,
                                    seed=3, **args)
        here = [Engine(weights_in(copy.deepcopy(policy), torch.bfloat16), limits, seed=remote.engine_seed(3, i), **args)
                for i in range(engines)]
        gen = torch.Generator().manual_seed(5)
        new = {n: t + 0.01 * torch.randn(t.shape, generator=gen) for n, t in policy.state_dict().items()}
        rows = {side: [Sequence(i, 1, [5 + i, 7, 9 + i]) for i in range(5)] for side in ("here", "there")}
        ended = {"here": [], "there": []}
        # there: one engine of several processes; here: the same engines stepped in turn in this process
        there.start(rows["there"])
        ended["there"] += there.step()
        there.load(new, version=1)  # mid-generation: the running rows go on with the new weights
        while there.running:
            ended["there"] += there.step()
        bounds = [5 * i // engines for i in range(engines + 1)]
        for i, engine in enumerate(here):
            engine.start(rows["here"][bounds[i]:bounds[i + 1]])
            ended["here"] += engine.step()
            engine.load(new, version=1)
            while engine.running:
                ended["here"] += engine.step()
        checksums = there.checksums()
        try:
            there.load({n: t for n, t in new.items() if n != "model.norm.weight"}, version=2)
            refused = ""
        except RuntimeError as err:
            refused = str(err)
        same_rng = [torch.equal(a, b.rng.get_state()) for a, b in zip(there.rng.get_state(), here)]
        there.close()
        torch.save({"rows": {side: [vars(r) for r in rs] for side, rs in rows.items()},
                    "same_objects": {side: sorted(map(id, ended[side])) == sorted(map(id, rows[side]))
                                     for side in rows},
                    "trainer": {n: remote.checksum(t.to(torch.bfloat16)) for n, t in new.items()},
                    "engines": checksums, "refused": refused, "version": there.version, "same_rng": same_rng},
                   out)
        groups.shutdown()


class _EngineThatCannotClose(Engine):
    def close(self) -> None:
        raise RuntimeError("no")


def _engine_that_cannot_close(limits, seed: int, engine_args: dict) -> Engine:
    """A RemoteEngine build (pickled to the engine process): our engine, whose close fails."""
    cfg = OmegaConf.create(_config())
    return _EngineThatCannotClose(build_policy(cfg.model, 0).eval(), limits, seed=seed, **engine_args)


def _closing(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from ablate.generators import remote

    torch.set_num_threads(1)
    groups = process_groups.connect(dist.FileStore(init_file, 2), rank, trainers=1, engines=1, backend="gloo")
    try:
        if rank == 1:
            remote.serve(groups)
            Path(out + ".engine").write_text("served")
        else:
            cfg = OmegaConf.create(_config())
            args = {"head_dtype": torch.float32, "temperature": 1.0, "pad_id": 0, "compute_dtype": torch.float32}
            policy = build_policy(cfg.model, cfg.seed)
            there = remote.RemoteEngine(OmegaConf.to_container(cfg.model), Limits(4, 4, (0,), None),
                                        policy.state_dict(), groups=groups, seed=3, build=_engine_that_cannot_close,
                                        **args)
            there.close()
            Path(out).write_text("closed")
    finally:
        groups.shutdown()


@pytest.mark.e2e
def test_an_engine_process_whose_engine_fails_to_close_still_ends_with_the_job(tmp_path):
    """Closing is the job's last word to an engine process: an engine whose own close fails (a vLLM core that will not
    shut down) is logged there, and the process still answers and ends, instead of leaving rank 0 (and the job)
    waiting for it."""
    where = spawn_ranks(_closing, tmp_path)
    assert (where / "out").read_text() == "closed" and (where / "out.engine").read_text() == "served"


@pytest.mark.e2e
@pytest.mark.parametrize("engines", [1, 2])
def test_engines_in_their_own_processes_decode_as_in_this_one_and_hold_the_trainers_weights(engines, tmp_path):
    """run.generator_gpus=N's engines (ablate/generators/remote.py) against the same engines in the trainer's
    process: the same seeds, rows (dealt in slices) and mid-generation load give the same tokens, log-probs and
    versions; the rows handed back are the pipeline's own objects; after the load every tensor of every engine
    process has the sha256 of the trainer's (in the engines' bf16); a load that misses a tensor is refused, naming
    it, before anything is sent."""
    out = torch.load(spawn_ranks(_engine_processes, tmp_path, engines, nprocs=1 + engines) / "out",
                     weights_only=False)
    here, there = out["rows"]["here"], out["rows"]["there"]
    assert [r["tokens"] for r in there] == [r["tokens"] for r in here] and all(r["done"] for r in there)
    assert [r["logprobs"] for r in there] == [r["logprobs"] for r in here]
    assert [r["versions"] for r in there] == [r["versions"] for r in here]
    assert {v for r in there for v in r["versions"]} == {0, 1}  # tokens of both versions: the load was mid-row
    assert out["same_objects"] == {"here": True, "there": True}
    assert len(out["engines"]) == engines and all(c == out["trainer"] for c in out["engines"]) and out["trainer"]
    assert "miss 1 of the engine's tensors (model.norm.weight)" in out["refused"]
    assert out["version"] == 1 and out["same_rng"] == [True] * engines


def _streamed(rank: int, init_file: str, out: str) -> None:
    """Ranks 0, 1: FSDP trainer ranks with run.generator_gpus=1 (rank 0 keeps no whole copy), driven by hand as
    `follow` would drive rank 1; rank 2: the engine process. After a step, rank 0 stages the weights (streamed from
    the shards, rank 1 taking part in each gather), the engine takes them, and the validation rows are decoded on the
    engine's staging copy and, for comparison, here on a whole copy made from the same stream."""
    import torch.distributed as dist

    from ablate.generators import remote
    from ablate.distributed.layouts import FSDP

    torch.set_num_threads(1)
    if rank < 2:  # the trainer ranks' world; the engine process is not in it
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    groups = process_groups.connect(dist.FileStore(f"{init_file}-engines", 3), rank, trainers=2, engines=1,
                                    backend="gloo")
    try:
        if rank == 2:
            remote.serve(groups)
        else:
            cfg = OmegaConf.create(_config("optim.lr=1e-3"))
            ranks = FSDP(trainer_gpus=2, generator_gpus=1, groups=groups)
            learner = Learner(cfg, ranks=ranks)
            learner.step(*_batch(cfg))
            if rank == 1:  # as `follow` would: the streams rank 0 takes below, and its second step
                for streams in (2, None, 2):
                    if streams is None:
                        learner.step(*_batch(cfg, prompts=range(4, 8)))
                        continue
                    for _ in range(streams):
                        for _ in ranks.weights(learner.policy):
                            pass
            else:
                limits = Limits(6, 4, (0,), None)
                args = {"head_dtype": torch.float32, "temperature": 1.0, "pad_id": 0,
                        "compute_dtype": torch.float32}
                weights = learner.weights()
                engine = remote.RemoteEngine(OmegaConf.to_container(cfg.model), limits, weights, groups=groups, seed=3,
                                             **args)
                first = {n: remote.checksum(t) for n, t in learner.weights().stream()}
                try:
                    weights.module()
                    refused = ""
                except RuntimeError as err:
                    refused = str(err)
                learner.step(*_batch(cfg, prompts=range(4, 8)))
                engine.stage(learner.weights(), version=1)  # staged, not taken: the engine decodes on with step 1's
                whole = build_policy(cfg.model, cfg.seed + 1).eval()
                whole.load_state_dict(dict(learner.weights().stream()))
                second = {n: remote.checksum(t) for n, t in whole.state_dict().items()}
                rows = {side: [Sequence(i, 1, [5 + i, 7, 9 + i]) for i in range(7)] for side in ("here", "there")}
                engine.decode_staged(rows["there"], seed=11, max_waves=2, wave_rows=3)
                decode(Engine(whole, limits, seed=11, **args), rows["here"], max_waves=2, wave_rows=3)
                live = engine.checksums()[0]
                engine.load(None, version=1)
                torch.save({"full": ranks.full, "refused": refused, "first": first, "second": second, "live": live,
                            "taken": engine.checksums()[0], "version": engine.version,
                            "rows": {side: [vars(r) for r in rs] for side, rs in rows.items()}}, out)
                engine.close()
    finally:
        groups.shutdown()
        if rank < 2:
            dist.barrier()
            dist.destroy_process_group()


@pytest.mark.e2e
def test_with_an_engine_process_the_weights_stream_from_the_shards_and_validation_runs_there(tmp_path):
    """run=fsdp run.generator_gpus=1: rank 0 never holds the whole policy (no copy, and asking for one is an error
    naming why); the engine's tensors after a stream have the sha256 of the trainer's full tensors; new weights
    staged leave the decoding copy alone until the engine takes them; validation rows decoded on the staging copy
    (the newest weights) are token for token those decoded here on the same weights."""
    out = torch.load(spawn_ranks(_streamed, tmp_path, nprocs=3) / "out", weights_only=False)
    assert out["full"] is None and "rank 0 keeps no whole copy of the policy" in out["refused"]
    assert len(out["first"]) > 5 and out["first"] != out["second"]  # the second step changed the weights
    assert out["live"] == out["first"]  # staging step 2's weights left the decoding copy as it was
    assert out["taken"] == out["second"] and out["version"] == 1  # until the engine took them
    here, there = out["rows"]["here"], out["rows"]["there"]
    assert all(r["done"] for r in there) and sum(len(r["tokens"]) for r in there) > 7
    assert [r["tokens"] for r in there] == [r["tokens"] for r in here]
    assert [lp for r in there for lp in r["logprobs"]] == pytest.approx([lp for r in here for lp in r["logprobs"]],
                                                                       abs=1e-5)


def _ignores_the_warning_at_exit(groups) -> str:
    """Rank 0's work in the test below: at its process's exit, fail it (exit code 12) unless SLURM's warning is
    ignored there."""
    import atexit

    def check() -> None:
        if signal.getsignal(signal.SIGUSR2) is not signal.SIG_IGN:
            os._exit(12)

    atexit.register(check)
    return "done"


def test_a_warning_as_the_ranks_exit_does_not_fail_a_finished_job():
    """SLURM's warning (USR2) reaches every process of a job, whenever it comes: also as the ranks exit, their work
    done. Python resets its handlers to the default as it exits, and the default of USR2 is to die: a rank that still
    had one there was killed and the finished job reported failed (`trainer rank 0 failed: Signal 12`, seen on a
    2-rank + vLLM engine run warned at its last step). Every rank ignores it by then."""
    cfg = OmegaConf.create(_config("run=fsdp"))
    assert processes.launch(cfg, _ignores_the_warning_at_exit) == "done"


def _silent_then_a_step(cfg: dict, silent_s: float, groups) -> float:
    """Rank 0's work in the test below: silent for `silent_s` (a model load, a validation), then a learner step over
    the data plane with the other rank."""
    time.sleep(silent_s)
    cfg = OmegaConf.create(cfg)
    learner = Learner(cfg, ranks=build(cfg.run, groups=groups))
    return learner.step(*_batch(cfg))["loss/policy"]


@pytest.mark.e2e
def test_a_follower_outwaits_a_silent_rank_0_longer_than_the_data_planes_timeout():
    """A trainer rank other than 0 waits for rank 0's next call over the control plane (a gloo group with
    run.control_timeout_min), not over the data plane, whose collectives time out after run.data_timeout_min (NCCL's
    watchdog on GPUs would end the job): rank 0 silent for 10 s against a 6 s data-plane timeout (time enough for a
    follower to build its learner when rank 0 says so), then a step together, and the job ends with the step's loss."""
    cfg = _config("run=fsdp", "run.data_timeout_min=0.1", "run.control_timeout_min=1")
    loss = processes.launch(OmegaConf.create(cfg), _silent_then_a_step, cfg, 10.0)
    assert math.isfinite(loss)


def _never_reached(groups) -> str:
    return "ran"


class Requeued(Exception):
    """What the tests' stand-in for submitit's handler raises (submitit's requeues the job, then exits)."""


@contextmanager
def submitit_handlers():
    """submitit's handlers as a job's process has them, for the tests below: USR2 requeues (here: raises Requeued),
    SIGTERM is bypassed (the requeue is under way); yields them (requeue, bypass), restores the ones before."""
    def requeue(signum, frame) -> None:
        raise Requeued

    def bypass(signum, frame) -> None:
        pass

    displaced, terminate = signal.signal(signal.SIGUSR2, requeue), signal.signal(signal.SIGTERM, bypass)
    try:
        yield requeue, bypass
    finally:
        signal.signal(signal.SIGUSR2, displaced)
        signal.signal(signal.SIGTERM, terminate)


def test_a_warning_while_the_ranks_start_requeues_the_job_instead_of_killing_them():
    """SLURM's warning reaches every process of the job at once: also ranks still starting (importing torch), where
    USR2 still does what it does by default, which is to end the process. They were killed and the job failed
    (`trainer rank 0 failed: Signal 12`) instead of requeuing. Here it reaches this process and each rank as soon as
    the rank exists: the ranks hold it until their handlers are set, rank 0 stops before its work, and the job is
    handed to the requeue handler; this thread's signal mask is as it was, and SIGTERM's handler is submitit's
    bypass again (torch's launcher left its own, which raised in the middle of the requeue)."""
    import threading

    cfg = OmegaConf.create(_config("run=fsdp"))
    warned: set[int] = set()
    stop = threading.Event()

    def warn_as_the_ranks_appear() -> None:  # as SLURM does: the job's every process
        while not stop.is_set() and len(warned) < 2:
            for pid in set(signals.ranks_started_here()) - warned:
                if not warned:
                    os.kill(os.getpid(), signal.SIGUSR2)
                os.kill(pid, signal.SIGUSR2)
                warned.add(pid)
            time.sleep(0.005)

    sender = threading.Thread(target=warn_as_the_ranks_appear, daemon=True)
    with submitit_handlers() as (_, bypass):
        sender.start()
        try:
            with pytest.raises(Requeued):
                processes.launch(cfg, _never_reached)
            assert signal.getsignal(signal.SIGTERM) is bypass
        finally:
            stop.set()
            sender.join()
    assert len(warned) == 2
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def _slow_to_stop(started: str, groups) -> str:
    """Rank 0's work in the test below: started (its pid written to `started`), then slow to end, as rank 0 is at
    8B after SLURM's warning (its checkpoint, the engines' shutdown); the warning it holds, blocked since its
    start-up (`defer_the_warning`), is never acted on."""
    Path(started).write_text(str(os.getpid()))
    time.sleep(120)
    return "done"


def _pending(pid: int, signum: int) -> bool:
    """Whether process `pid` holds signal `signum` pending (blocked, not yet taken): /proc's ShdPnd."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_the_time_limit_inside_torchs_launcher_after_the_warning_still_requeues_the_job(tmp_path):
    """SLURM's SIGTERM at the time limit can reach the job's process while torch's launcher still runs its ranks,
    after the warning (USR2): rank 0's checkpoint or the engines' shutdown ran long, or the launcher waits in its
    exit barrier (up to 300 s). torch's handler took it: it raised, the launcher stopped the ranks, and `launch`
    raised it on (SignalException): the job ended failed, not requeued, its run left RUNNING with no job behind it.
    Now SIGTERM after a warning is the launcher's process's own: it hands the job to the requeue handler the warning
    displaced (submitit's) at once, and the launcher stops its ranks on the way out. Here the warning reaches this
    process (and rank 0, which holds it: its pending USR2 shows it was passed on), then SIGTERM, with rank 0 still
    busy; SLURM's SIGTERM to the ranks themselves ends them either way."""
    cfg = OmegaConf.create(_config("run=fsdp"))
    started, sent = tmp_path / "started", []

    def warn_then_stop() -> None:  # as SLURM does at the time limit, less its SIGKILL
        deadline = time.monotonic() + 120
        while not started.exists() or not started.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        rank_0 = int(started.read_text())
        os.kill(os.getpid(), signal.SIGUSR2)
        while not _pending(rank_0, signal.SIGUSR2) and time.monotonic() < deadline:
            time.sleep(0.05)
        sent.append(rank_0)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=warn_then_stop, daemon=True)
    began = time.monotonic()
    with submitit_handlers() as (requeue, bypass):
        sender.start()
        try:
            with pytest.raises(Requeued):
                processes.launch(cfg, _slow_to_stop, str(started))
            assert time.monotonic() - began < 100  # rank 0's 120 s were not waited out
            assert signal.getsignal(signal.SIGTERM) is bypass and signal.getsignal(signal.SIGUSR2) is requeue
        finally:
            sender.join()
    assert sent and not Path(f"/proc/{sent[0]}").exists()  # rank 0 stopped by the launcher


def test_the_time_limit_in_the_launchers_exit_barrier_still_requeues_the_job():
    """Where the launcher's process waits in torch's exit barrier (a node's ranks done, the other nodes' not yet:
    up to 300 s), its main thread is in a C++ store wait and no Python handler runs until that returns: SLURM's
    SIGTERM there was taken by nobody, and the job was killed at the limit, not requeued. A thread that sees the
    signal arrive requeues in its place within a second, and the main thread raises what the requeue raised once
    it runs again. Here torch's own barrier function, the store's other member never coming, for 5 s."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.utils import store as store_util

    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=20), wait_for_workers=False)
    requeued: list[float] = []

    def requeue() -> None:
        requeued.append(time.monotonic())
        raise Requeued

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Requeued):
        with signals.the_time_limit_taken(lambda: True, requeue):
            sent = time.monotonic() + 0.5
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            store_util.barrier(store=store, world_size=2, key_prefix="exit", barrier_timeout=5)
    assert len(requeued) == 1 and requeued[0] - sent < 3.0  # within the grace, not the barrier's 5 s
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_warning_during_rank_0s_start_up_waits_for_the_trainers_handler():
    """Rank 0 stops at once for a warning that came before its work (above), but one that comes during the
    trainer's start-up (the model's build, FSDP's broadcasts, a checkpoint's load: minutes at 8B) ended it in the
    middle of a collective, its peers left waiting until run.data_timeout_min. Now it waits, blocked, for the
    trainer's own handler, which takes it at once and acts at its first safe point (rank_main's calls, in this
    thread: the signal sent to it alone, as SLURM's reaches the process)."""
    import threading

    from ablate.trainer import PreemptionNotice

    stopped = []
    before, mask = signal.getsignal(signal.SIGUSR2), signal.pthread_sigmask(signal.SIG_BLOCK, set())
    try:
        signals.take_the_warning(lambda signum, frame: stopped.append(signum))  # rank_main's stop_for_requeue
        signals.defer_the_warning()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)  # during start-up
        time.sleep(0.2)
        assert stopped == []  # not ended in the middle of start-up
        with PreemptionNotice() as notice:
            assert notice.received and stopped == []  # the trainer's, held until its safe point
        assert signal.getsignal(signal.SIGUSR2) != notice._hold  # closed: the stop is the handler again
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGUSR2, before)


def test_rank_0s_failure_reaches_a_watching_process_within_seconds(capsys):
    """A follower or an engine process blocked where rank 0's end cannot reach it (an NCCL collective rank 0 left:
    here, this test's main thread, waiting) waited until run.data_timeout_min. Rank 0, failing, writes its error to
    the job's store; the watching thread sees it within its 0.1 s here (1 s in a job) and ends the process (here:
    `end`), naming rank 0's error; when the store itself is gone (node 0's launcher ended), two asks later."""
    import threading

    from torch.distributed import TCPStore

    from ablate.distributed import watch

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ended = threading.Event()
    codes = []

    def end(code):
        codes.append(code)
        ended.set()

    with watch.watching(TCPStore("127.0.0.1", server.port, is_master=False), "trainer rank 1", every_s=0.1, end=end):
        assert not ended.wait(0.5)  # nothing wrong: it only watches
        began = time.monotonic()
        watch.tell(TCPStore("127.0.0.1", server.port, is_master=False), RuntimeError("CUDA out of memory\nmore"))
        assert ended.wait(5) and time.monotonic() - began < 1.0
    assert codes == [watch.ENDED]
    assert "trainer rank 1 stops: rank 0 failed: RuntimeError: CUDA out of memory" in capsys.readouterr().err

    server2 = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ended.clear()
    with watch.watching(TCPStore("127.0.0.1", server2.port, is_master=False), "engine", every_s=0.1, end=end):
        del server2  # node 0's launcher, and its store, gone
        assert ended.wait(5)
    assert "engine stops: rank 0 failed: the job's store on node 0 is gone" in capsys.readouterr().err

    ended.clear()
    client = TCPStore("127.0.0.1", server.port, is_master=False)
    client.delete_key(watch.FAILED)
    with watch.watching(client, "trainer rank 1", every_s=0.1, end=end):
        pass  # a clean end: left before anything failed
    watch.tell(client, RuntimeError("after the end"))
    assert not ended.wait(0.5)


def _exits_with_code_3(groups) -> None:
    os._exit(3)


def test_a_rank_that_exits_with_a_code_is_named_with_it():
    """No Python error to quote (torch's own message is then a link to its docs): the rank and its exit code."""
    cfg = OmegaConf.create(_config("run=fsdp"))
    with pytest.raises(RuntimeError, match=r"^trainer rank 0 failed: it exited with code 3 \(its log: above\)$"):
        processes.launch(cfg, _exits_with_code_3)


def _fails_and_so_does_the_release(groups) -> None:
    from ablate.generators import remote

    def broken(groups):
        raise RuntimeError("the engines' release failed too")
    remote.release = broken  # in this rank's process: what rank 0 calls after the run, failing or not
    raise ValueError("the run's own error")


def test_a_wind_up_that_fails_after_rank_0_failed_does_not_replace_its_error():
    """Before, remote.release raising in rank 0's `finally` replaced rank 0's error in the one line reported."""
    cfg = OmegaConf.create(_config("run=fsdp"))
    with pytest.raises(RuntimeError, match=r"^trainer rank 0 failed: ValueError: the run's own error"):
        processes.launch(cfg, _fails_and_so_does_the_release)


def _done_but_the_wind_up_fails_and_the_process_lingers(returned: str, groups) -> str:
    """Rank 0's work in the test below: done, then its wind-up's release of the engines fails, and a thread that is
    no daemon (a library's) keeps its process alive for a minute after that."""
    import threading

    from ablate.generators import remote

    def broken(groups):
        raise RuntimeError("the engines' release failed")

    remote.release = broken
    threading.Thread(target=time.sleep, args=(60.0,), daemon=False).start()
    Path(returned).write_text(repr(time.time()))
    return "done"


def test_a_follower_is_released_within_seconds_when_rank_0s_clean_wind_up_fails(tmp_path):
    """Rank 0 done, it tells the other trainer ranks to stop and they wait for it at the job's last barrier; then its
    wind-up fails (the engines' release, the groups' shutdown). Nothing told them: they waited there as long as rank
    0's process lived (here a minute, held by a thread; up to run.control_timeout_min, 12 h, gloo seeing no socket
    close). Now rank 0 writes its error to the job's store, the follower still watches it at the barrier and ends
    within seconds, the first process to end: the job's one line names it, quoting rank 0's error."""
    cfg = OmegaConf.create(_config("run=fsdp"))
    returned = tmp_path / "returned"
    with pytest.raises(RuntimeError) as failed:
        processes.launch(cfg, _done_but_the_wind_up_fails_and_the_process_lingers, str(returned))
    waited = time.time() - float(returned.read_text())
    assert waited < 10.0, f"the follower was released {waited:.0f} s after rank 0's work was done"
    assert re.match(r"trainer rank 1 failed: rank 0 failed: RuntimeError: the engines' release failed \(its log: "
                    r".*error\.json\)$", str(failed.value)), str(failed.value)


def test_gpu_ranks_beyond_the_machines_cuda_devices_are_one_clear_error(monkeypatch):
    """run=fsdp on GPUs takes one CUDA device per process on each node (two NCCL ranks on one GPU crash): too few is
    an error that names both numbers, raised before any rank starts."""
    cfg = OmegaConf.create(_config("run=fsdp", "run.trainer_gpus=2"))
    cfg.model.device = "cuda"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    started = []
    with pytest.raises(ValueError, match=r"run.trainer_gpus=2: this node has 1 CUDA device\(s\)"):
        processes.launch(cfg, lambda who, groups: started.append(who), "trainer")
    assert started == []


LAYOUTS = {"one_process": ["run=one_process"], "fsdp": ["run=fsdp"],
           "fsdp+engine": ["run=fsdp", "run.generator_gpus=1"]}


@pytest.mark.e2e
def test_two_fsdp_ranks_and_an_engine_process_reproduce_the_one_process_run(tmp_path):
    """`python -m ablate run=fsdp` (2 trainer processes, gloo), and the same with the generator's engine in a third
    process of its own (run.generator_gpus=1), against `python -m ablate` on the same config: the deterministic
    schedule's rollouts, losses and validation curve agree (to 1e-4; measured: equal to 6 decimals)."""
    short = ["model.device=cpu", "train.steps=6", "train.val_every=2", "task.n_val_prompts=32"]
    curves = {}
    for layout, overrides in LAYOUTS.items():
        folder = tmp_path / layout
        folder.mkdir()
        out = run_cli("-m", "ablate", *overrides, *short, cwd=folder)
        assert out.returncode == 0, out.stderr[-3000:]
        client = tracking.client(f"sqlite:///{folder / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
        assert run.info.status == "FINISHED"
        assert run.data.params["trainer.ranks"] == str(1 + ("fsdp" in layout))
        assert run.data.params["run.generator_gpus"] == str(int("engine" in layout))
        perf = run.data.metrics  # the last step's: the engine decoded and loaded weights (in whichever process)
        assert perf["perf/generator_tokens_per_s_per_gpu"] > 0 and perf["perf/engine_load_s"] > 0
        assert perf["perf/weight_sync_s"] >= perf["perf/engine_load_s"] and "perf/trainer_mfu" not in perf
        # An engine process answers per run of steps, not per step: over the run, not at the last step alone (whose
        # window may hold only waves' one-step looks where another CPU's sampled lengths differ; CI saw 1.0 there).
        per_look = [m.value for m in client.get_metric_history(run.info.run_id, "perf/decode_steps_per_look")]
        assert len(per_look) == 6 and max(per_look) >= 2, per_look
        curves[layout] = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                                  key=lambda m: m.step)]
                          for key in ("val/pass_rate", "loss/policy", "train/reward_mean", "train/logprob_gap")}
        gaps = [v for _, v in curves[layout]["train/logprob_gap"]]  # the engine decoded with the trainer's weights
        assert gaps and max(gaps) < 1e-4, (layout, gaps)
    one = curves["one_process"]
    assert [s for s, _ in one["val/pass_rate"]] == [0, 2, 4, 6] and len(one["loss/policy"]) == 6
    for layout in ("fsdp", "fsdp+engine"):
        for key in one:
            assert [s for s, _ in curves[layout][key]] == [s for s, _ in one[key]], (layout, key)
            for (_, a), (_, b) in zip(curves[layout][key], one[key]):
                assert a == pytest.approx(b, rel=1e-4, abs=1e-6), (layout, key)


@pytest.mark.e2e
def test_a_rank_that_fails_is_named_in_one_line_and_its_run_is_failed(tmp_path):
    out = run_cli("-m", "ablate", "run=fsdp", "model.device=cpu", "generator=mock", "generator.crash_at_step=2",
                  "train.steps=5", cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: trainer rank 0 failed: RuntimeError: the simulated job crashes at step 2"), last
    client = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("tiny-mock").experiment_id])
    assert run.info.status == "FAILED"


def _signalled(folder, signum: int, *overrides: str):
    """Start `python -m ablate run=fsdp generator=mock` in `folder`, send `signum` once its ranks have taken a learner
    step, and wait for it: (client, run, return code, stderr, its pid). The test's ./mlflow.db is made beforehand
    (the mlflow_uri fixture), so polling it never races the run's own schema migration."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "run=fsdp", "model.device=cpu", "generator=mock",
                             "train.steps=100000", *overrides], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, run = time.monotonic() + 120, None
        while run is None:
            assert time.monotonic() < deadline, "the run did not start training"
            time.sleep(1.0)
            client = tracking.client(f"sqlite:///{folder / 'mlflow.db'}")
            exp = client.get_experiment_by_name("tiny-mock")
            runs = [] if exp is None else client.search_runs([exp.experiment_id])
            if runs and client.get_metric_history(runs[0].info.run_id, "loss/policy"):
                run = runs[0]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return client, run, proc.returncode, err, proc.pid


@pytest.mark.e2e
def test_ctrl_c_on_a_two_rank_run_prints_one_line_and_leaves_no_rank_behind(tmp_path, mlflow_uri):
    """Ctrl-C reaches the launcher, which stops the ranks; rank 0 closes its run as KILLED; no traceback, no
    warnings of cut-off collectives, no process left."""
    client, run, code, err, pid = _signalled(tmp_path, signal.SIGINT)
    assert code == 130
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err and "unwaited collective" not in err
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    left = []
    for _ in range(20):  # the launcher has stopped its ranks; the spawn start method's helpers go a moment later
        left = subprocess.run(["pgrep", "-a", "-s", str(pid)], capture_output=True, text=True).stdout.splitlines()
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"processes left in the session: {left}"


@pytest.mark.e2e
def test_the_warning_signal_checkpoints_both_ranks_at_the_end_of_the_step(tmp_path, mlflow_uri):
    """SLURM's USR2 to the job's process (here by hand, no SLURM): it passes the warning to rank 0, which ends its
    step, checkpoints (the payload and both ranks' shards) and stops with the run still RUNNING; with no requeue
    handler (submitit's, on SLURM) the command then ends as interrupted. The resume itself: test_resume."""
    client, run, code, err, _ = _signalled(tmp_path, signal.SIGUSR2, "train.checkpoint_every=100000")
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted", err[-2000:]
    finished = client.get_run(run.info.run_id)
    assert finished.info.status == "RUNNING"  # to be resumed
    step = int(finished.data.tags["ablate.requeued_at"])
    folder = tmp_path / "outputs" / "tiny" / "runs" / run.info.run_id
    assert (folder / "checkpoint.pt").exists() and [p.name for p in folder.glob("learner-*")] == [f"learner-{step}"]
    last = max(m.step for m in client.get_metric_history(run.info.run_id, "compute/gpu_hours"))
    assert last == step  # stopped at the end of the step it checkpointed


BAD_LAYOUTS = [
    (["run=fsdp", "run.trainer_gpus=1"],
     "run=fsdp with run.trainer_gpus=1: this layout takes at least 2 trainer ranks (one rank is run=one_process)"),
    (["run.trainer_gpus=2"],
     "run=one_process with run.trainer_gpus=2: this layout takes exactly 1 trainer rank (more are run=fsdp)"),
    (["run=fsdp", "run.trainer_gpus=16", "launcher.gpus_per_node=8"],
     "run.trainer_gpus=16 does not fit the job: launcher.nodes=1 x launcher.gpus_per_node=8 = 8 GPUs"),
    (["run=fsdp", "run.trainer_gpus=8", "run.generator_gpus=1", "launcher.gpus_per_node=8"],
     "run.trainer_gpus=8 + run.generator_gpus=1 does not fit the job: launcher.nodes=1 x launcher.gpus_per_node=8 "
     "= 8 GPUs"),
    (["run=fsdp", "run.trainer_gpus=3", "launcher.gpus_per_node=2", "launcher.nodes=2"],
     "run.trainer_gpus=3 = 3 processes do not spread evenly over launcher.nodes=2"),
    (["run=fsdp", "run.generator_gpus=1", "launcher.nodes=2"],
     "run.trainer_gpus=2 + run.generator_gpus=1 = 3 processes do not spread evenly over launcher.nodes=2"),
    (["run=fsdp", "launcher=local", "launcher.nodes=2"], "launcher.nodes=2 needs SLURM (launcher=slurm)"),
    (["run.generator_gpus=-1"], "run.generator_gpus=-1: 0 (the engine in trainer rank 0's process) or more"),
    (["generator=mock", "run.generator_gpus=1"],
     "run.generator_gpus=1: generator=mock has no engine that runs in a process of its own"),
    (["generator=vllm", "generator.tensor_parallel_size=2"],
     "generator.tensor_parallel_size=2 with run.generator_gpus=0: each engine takes 2 GPUs in processes of their "
     "own, so run.generator_gpus must be a multiple of 2"),
    (["generator=vllm", "generator.tensor_parallel_size=2", "run.generator_gpus=3"],
     "generator.tensor_parallel_size=2 with run.generator_gpus=3: each engine takes 2 GPUs"),
    (["generator=vllm", "generator.tensor_parallel_size=0", "run.generator_gpus=1"],
     "generator.tensor_parallel_size=0: 1 or more GPUs per engine"),
    (["run=fsdp", "generator=vllm", "generator.tensor_parallel_size=4", "run.generator_gpus=4", "launcher=slurm",
      "launcher.nodes=2", "launcher.gpus_per_node=4"],
     "generator.tensor_parallel_size=4: an engine's GPUs must share a node, so run.trainer_gpus=2 and the 3 "
     "processes a node must be multiples of 4"),
    (["generator=vllm", "generator.weight_transfer=direct"],
     "generator.weight_transfer=direct sends the weights to engine processes, and run.generator_gpus=0 has none"),
    (["generator=vllm", "generator.weight_transfer=direct", "run.generator_gpus=1", "off_policy=ppo_off_policy"],
     "generator.weight_transfer=direct takes each step's weights as they arrive, mid-generation; "
     "off_policy=ppo_off_policy (in_flight=False) holds them back"),
    (["generator=vllm", "generator.weight_transfer=direct", "run.generator_gpus=1", "off_policy.in_flight=false"],
     "generator.weight_transfer=direct takes each step's weights as they arrive, mid-generation; "
     "off_policy=pipeline_rl (in_flight=False) holds them back"),
    (["generator=vllm", "generator.weight_transfer=nccl", "run.generator_gpus=1"],
     "generator.weight_transfer=nccl: staged or direct"),
]


@pytest.mark.parametrize("overrides,message", BAD_LAYOUTS, ids=[" ".join(o) for o, _ in BAD_LAYOUTS])
def test_a_layout_that_cannot_run_fails_before_submit_naming_the_numbers(overrides, message):
    from ablate.checks import check_run

    with pytest.raises(ValueError) as err:
        check_run(compose(overrides))
    assert str(err.value).startswith(message), str(err.value)


def test_a_bad_layout_is_one_line_from_the_cli_and_creates_no_run(tmp_path):
    out = run_cli("-m", "ablate", "run=fsdp", "run.trainer_gpus=2", "run.generator_gpus=1",
                  "launcher.gpus_per_node=2", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: run.trainer_gpus=2 + run.generator_gpus=1 does not fit the job: launcher.nodes=1 x "
        "launcher.gpus_per_node=2 = 2 GPUs"]
    assert not (tmp_path / "mlflow.db").exists()  # no run was made


def _free_rendezvous_job_id() -> int:
    """A SLURM-like job id whose rendezvous port (ablate/distributed/topology.py: rendezvous_port) is free here."""
    import random
    import socket

    from ablate.distributed.topology import rendezvous_port

    for _ in range(100):
        job = random.randrange(1, 10000)
        with socket.socket() as s:
            try:
                s.bind(("localhost", rendezvous_port(str(job))))
                return job
            except OSError:
                continue
    raise RuntimeError("no free rendezvous port")


def test_the_rendezvous_port_is_below_the_ephemeral_range_and_the_same_on_every_node():
    """Linux hands out 32,768-60,999 (by default) to outgoing connections: a rendezvous port there may be taken on
    the head node by any of them. Job 1,234,567: 20,000 + 4,567."""
    from ablate.distributed.topology import rendezvous_port

    assert rendezvous_port("1234567") == 24567
    assert max(rendezvous_port(str(job)) for job in range(20000)) == 29999 < 32768
    assert min(rendezvous_port(str(job)) for job in range(20000)) == 20000


@pytest.mark.e2e
def test_a_job_of_two_nodes_starts_its_ranks_on_both_and_finishes(tmp_path):
    """What a SLURM job of 2 nodes runs, one task per node (`ablate.job.run_variant` with SLURM's variables; both
    "nodes" on this machine): node 0 starts trainer ranks 0-1 and hosts the rendezvous, node 1 the 2 engine
    processes (ranks 2-3); the run finishes, node 0's task returns the result and node 1's returns without one.
    The default suite's 2-node job (25 s); tests/test_slurm.py runs them on a real 2-node cluster with -m slow."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "nodes"), "scalerl", {})
    config = OmegaConf.to_container(compose(["run=fsdp", "run.generator_gpus=2", "launcher.nodes=2", "model.device=cpu",
                                             "train.steps=4", "train.val_every=2", "task.n_val_prompts=16",
                                             f"paths.outputs={tmp_path}", f"paths.cache={tmp_path / 'cache'}"]),
                                    resolve=True, enum_to_str=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    job = _free_rendezvous_job_id()
    code = ("import json, sys; from ablate.job import run_variant; "
            "print('RESULT', json.dumps(run_variant(json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3])))")
    nodes = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "config.json"), run_id, uri], cwd=tmp_path,
                              env={**os.environ, "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": str(i),
                                   "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": str(job)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 0)]
    outs = [node.communicate(timeout=240) for node in nodes]  # node 1 first: it waits for node 0's rendezvous
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outs]
    results = [json.loads(out.split("RESULT ", 1)[1]) for out, _ in outs]
    assert results[0] == {"run_id": run_id} and results[1]["step"] == 4
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["trainer.ranks"] == "2"
    assert max(m.value for m in client.get_metric_history(run_id, "perf/engine_load_s")) > 0  # the engines loaded


def test_the_devices_a_job_holds_count_every_gpu_of_every_node(monkeypatch):
    """compute/gpu_hours counts every GPU the job holds: 8 visible on each of 10 nodes = 80 (the paper's layout),
    not the 8 rank 0 sees; a CPU is one device a node."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "10")
    assert topology.devices_held(torch.device("cuda")) == 80 and topology.devices_held(torch.device("cpu")) == 10
    monkeypatch.delenv("SLURM_JOB_NUM_NODES")
    assert topology.devices_held(torch.device("cuda")) == 8 and topology.devices_held(torch.device("cpu")) == 1


def test_an_engine_process_sees_its_engines_gpus_as_the_node_lists_them():
    """On a GPU node, engine processes (local ranks after the trainers') see only their engine's GPUs: one each, or
    the tensor-parallel engine's t, counted in the node's own CUDA_VISIBLE_DEVICES order when it has one."""
    assert topology.engine_gpus(local=2, tp_rank=0, tp=1, visible=None) == "2"
    assert topology.engine_gpus(local=5, tp_rank=1, tp=2, visible=None) == "4,5"
    assert topology.engine_gpus(local=4, tp_rank=0, tp=2, visible="0,1,2,3,4,5,6,7") == "4,5"
    assert topology.engine_gpus(local=5, tp_rank=1, tp=2, visible="7,6,5,4,3,2,1,0") == "3,2"


def test_processes_fed_by_rank_0_make_the_model_in_their_dtype_without_reading_the_checkpoint(tmp_path):
    """An engine process's staging copy (and another trainer rank's policy) from model.path: the architecture made
    in its own dtype on its device, the checkpoint never read (its weights come from rank 0), so no process holds a
    whole fp32 copy of it in host memory first: here the folder's weights file is gone and both still build."""
    from ablate.generators.remote import _torch_model

    cfg = OmegaConf.create(_config())
    folder = tmp_path / "model"
    build_policy(cfg.model, cfg.seed).save_pretrained(folder)
    (weights_file,) = folder.glob("*.safetensors")
    weights_file.unlink()
    model = {**OmegaConf.to_container(cfg.model), "path": str(folder)}
    staged = _torch_model(model, torch.bfloat16)
    assert {p.dtype for p in staged.parameters()} == {torch.bfloat16}
    follower = build_policy(OmegaConf.create(model), cfg.seed, read_weights=False)
    assert {p.dtype for p in follower.parameters()} == {torch.float32}
    assert staged.state_dict().keys() == follower.state_dict().keys()
    with pytest.raises(OSError):  # what reading it would have done
        build_policy(OmegaConf.create(model), cfg.seed)


def test_a_following_rank_is_sent_its_own_rows_and_the_batch_wide_fields():
    """FSDP.lead_step sends rank r of 2 `rows_only(rows)` of the rows it will deal itself: their tokens, prompts,
    log-probs and versions, every row's rewards, lengths and masks; it steps on `expanded(rows)`, the batch again
    with zeros at the rows it does not train. Before, each rank was sent the whole batch."""
    import pickle

    ro, _, keep = _batch(OmegaConf.create(_config()), prompts=range(8))
    lengths, trained = ro.prompt_mask.sum(dim=1) + ro.lengths, (ro.mask & keep[:, None]).any(dim=1)
    rows = torch.nonzero(deal(lengths, trained, 1, 2)).squeeze(1)
    share = ro.rows_only(rows)
    assert share.tokens.shape[0] == len(rows) == ro.n // 2 and share.mask.shape == ro.mask.shape
    again = share.expanded(rows)
    for name in ("prompt_tokens", "tokens", "gen_logprobs", "versions"):
        whole, back = getattr(ro, name), getattr(again, name)
        assert back.shape == whole.shape and torch.equal(back[rows], whole[rows])
        others = torch.ones(ro.n, dtype=torch.bool)
        others[rows] = False
        assert not back[others].any()
    assert torch.equal(again.mask, ro.mask) and torch.equal(again.lengths, ro.lengths)
    assert len(pickle.dumps((share, rows))) < 0.7 * len(pickle.dumps(ro))
