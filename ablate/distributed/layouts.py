"""How the learner spreads over trainer processes: which rows of a step each trains, and how the weights are held.

`OneProcess` (the default: no torch.distributed) and `FSDP` (FSDP2 per decoder layer, fp32 masters, the gradients
summed across ranks so that the step is the whole batch's) answer the same questions, so no caller asks which it
has; `Weights` is the trainer's current weights as a generator takes them. Why: docs/design.md#trainer-ranks.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from ablate.distributed.groups import Groups
from ablate.distributed.leader import Leader

SHARDS = "learner-{tag}"  # the DCP folder of a checkpoint, beside its payload


def _norm_weights(layer: torch.nn.Module) -> set[torch.nn.Parameter]:
    """A decoder layer's norms' parameters, as the layer holds them now (sharding replaces them): those of its leaf
    modules whose parameters are all vectors (RMSNorm's, LayerNorm's weight and bias), which compute in fp32
    whatever the compute dtype."""
    norms = [m for m in layer.modules() if m is not layer and not any(True for _ in m.children())
             and any(True for _ in m.parameters()) and all(p.dim() == 1 for p in m.parameters())]
    return {p for norm in norms for p in norm.parameters()}


class OneProcess:
    """Every row in this process (the default layout: one device, or the CPU)."""

    rank, world = 0, 1
    ranks = (1, 1)  # the trainer ranks this layout takes (checked before submit: ablate.checks.check_run)

    def __init__(self, groups: Groups | None = None, **_: object) -> None:
        self.groups = groups if groups is not None else Groups()  # engine processes, when the job has them

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        return scorer

    def total(self, value: float) -> float:
        return value

    def sync_gradients(self, scorer: torch.nn.Module, now: bool) -> None:
        pass

    @staticmethod
    def gradient_bytes(scorer: torch.nn.Module) -> int:
        """Bytes of gradients held now (each parameter's .grad)."""
        return sum(p.grad.numel() * p.grad.element_size() for p in scorer.parameters() if p.grad is not None)

    def save(self, learner, folder: Path, tag: int) -> dict:
        """The learner's part of a checkpoint's payload."""
        return {"policy": learner.policy.state_dict(), "optimizer": learner.optimizer.state_dict(),
                "scheduler": learner.scheduler.state_dict()}

    def load(self, learner, payload: dict, folder: Path) -> None:
        learner.policy.load_state_dict(payload["policy"])
        learner.optimizer.load_state_dict(payload["optimizer"])
        learner.scheduler.load_state_dict(payload["scheduler"])

    def prune(self, folder: Path, payload: dict) -> None:
        """Called once `payload` is the checkpoint: remove what older checkpoints left (here, nothing)."""

    def weights(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, (name, tensor) one tensor at a time: what a generator engine loads."""
        yield from policy.state_dict().items()

    stream = weights  # one process: nothing to lead

    def gathered(self, policy: torch.nn.Module) -> torch.nn.Module:
        """The policy with the trainer's current weights, whole: here, the trainer's own."""
        return policy

    def lead_step(self, *batch) -> None:
        """Before a learner step: nothing to tell (FSDP's rank 0 sends the batch to the other ranks)."""


class FSDP:
    """Data parallel over the trainer ranks' process group with FSDP2 (torch.distributed.fsdp.fully_shard).

    The learner's plan (ablate/plan.py) deals the rows to the ranks, every rank running the same number of
    forward/backward passes (FSDP's all-gathers and reduce-scatters pair up across ranks; a pass with no rows, where
    there are too few, has its loss weighted 0). Gradients are summed over the ranks in fp32 by reduce-scatter: after
    every pass into the shards (`sharded_gradients`, the default: a rank holds 4N/ranks bytes of gradients), or
    once, after the step's last pass (FSDP2 then accumulates a whole fp32 gradient on every rank, 4N bytes, for one
    collective a step instead of one a pass). In bf16 compute the decoder layers are gathered in bf16, their norms
    in fp32 (with the root: no FSDP hooks inside a layer), and the residual stream between them stays in fp32, as
    autocast leaves it in one process (docs/design.md#trainer-ranks). Needs torch.distributed initialized (by
    `launch`, or by a test's processes) with a backend for the weights' device: nccl on GPUs, gloo on the CPU.
    """

    ranks = (2, None)

    def __init__(self, trainer_gpus: int = 2, generator_gpus: int = 0, sharded_gradients: bool = True,
                 groups: Groups | None = None, **_: object) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("the FSDP layout needs torch.distributed initialized: its ranks are started by "
                               "ablate.processes.launch (`python -m ablate run=fsdp` does)")
        self.groups = groups if groups is not None else Groups()
        self.group = self.groups.trainer
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        if self.world != trainer_gpus:
            raise ValueError(f"run.trainer_gpus={trainer_gpus}, but {self.world} ranks were started")
        self.leader = Leader(self.groups, self.rank)
        self.sharded_gradients = sharded_gradients
        # rank 0's unsharded copy (`gathered`), for an engine in its process and validation there; none when the
        # engines have processes of their own: they get the weights streamed from the shards and validate there
        self.keeps_whole = self.rank == 0 and not generator_gpus
        self.full: torch.nn.Module | None = None
        self.device = torch.device("cpu")  # of the small tensors this layout reduces: the weights' device, once wrapped

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.leader.begin()
        self.device = next(scorer.parameters()).device
        with torch.no_grad():  # every rank starts from rank 0's weights (its warm start, or its checkpoint's)
            for tensor in scorer.state_dict().values():
                dist.broadcast(tensor, src=0, group=self.group)
        if self.keeps_whole:
            self.full = copy.deepcopy(scorer.model)
        mesh = DeviceMesh.from_group(self.group, self.device.type)  # the trainer ranks (engine processes apart)
        gathered = None if scorer.compute_dtype == torch.float32 else scorer.compute_dtype
        # the layers' inputs as they come (the residual stream in fp32, as under autocast in one process), their
        # matmuls' weights gathered in the compute dtype (autocast's cast of them), their norms in fp32 (the root's)
        layers = MixedPrecisionPolicy(param_dtype=gathered, reduce_dtype=torch.float32, cast_forward_inputs=False)
        fp32 = MixedPrecisionPolicy(reduce_dtype=torch.float32, cast_forward_inputs=False)
        # top down, the root first: its group takes every decoder layer's norms (gathered in fp32 with the embeddings,
        # once a pass), so that a layer's group is its matmuls alone and FSDP2's hooks are on the layer, none on a
        # norm inside it, which would cut a compiled layer's graph (docs/training.md#a-compiled-decoder)
        decoder = scorer.model.get_decoder().layers
        matmuls = {p for layer in decoder for p in set(layer.parameters()) - _norm_weights(layer)}
        groups = [fully_shard(scorer, mesh=mesh, mp_policy=fp32, ignored_params=matmuls)]
        groups += [fully_shard(layer, mesh=mesh, mp_policy=layers, ignored_params=_norm_weights(layer))
                   for layer in decoder]
        for group in groups:  # each shard group reduces its own gradients
            group.set_gradient_divide_factor(1.0)  # a sum over ranks: each rank's loss is its share of the whole
            group.set_force_sum_reduction_for_comms(True)  # as plain SUM (gloo has no pre-multiplied sum)
        return scorer

    def total(self, value: float) -> float:
        return self._reduce(value, "SUM")

    def sync_gradients(self, scorer: torch.nn.Module, now: bool) -> None:
        scorer.set_requires_gradient_sync(now or self.sharded_gradients)

    @staticmethod
    def gradient_bytes(scorer: torch.nn.Module) -> int:
        """Bytes of gradients this rank holds now: each parameter's sharded gradient, and the whole ones FSDP2
        accumulates between passes without a reduce-scatter (`FSDPParam.unsharded_accumulated_grad`, or the
        unsharded parameter's own .grad: private attributes of torch 2.11-2.13). For the memory benchmark and tests."""
        total = 0
        for module in scorer.modules():
            state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
            group = state._fsdp_param_group if state is not None else None
            for param in group.fsdp_params if group is not None else ():
                unsharded = getattr(param, "_unsharded_param", None)
                held = [param.unsharded_accumulated_grad, unsharded.grad if unsharded is not None else None,
                        param.sharded_param.grad.to_local() if param.sharded_param.grad is not None else None]
                total += sum(g.numel() * g.element_size() for g in held if g is not None)
        return total

    def lead_step(self, ro, rewards: torch.Tensor, keep: torch.Tensor, rows: list[list[int]]) -> None:
        """Rank 0, before a learner step: each other rank r is sent the rows it will train (`rows[r]`, as its own
        plan will deal them) and the batch-wide fields, and steps on the batch they make again (Rollouts.expanded)."""
        if not self.leader.leads:
            return
        shares = [None]
        for rank in range(1, self.world):
            mine = torch.tensor(rows[rank], dtype=torch.long, device=ro.mask.device)
            shares.append((ro.rows_only(mine), mine, rewards, keep))
        self.leader.step(shares)

    def gathered(self, policy: torch.nn.Module) -> torch.nn.Module | None:
        """Rank 0's unsharded copy of the policy with the trainer's current weights (gathered tensor by tensor), for
        an engine in rank 0's process and validation there; None on the other ranks. The copy costs rank 0 one model
        of memory, so it exists only without engine processes (run.generator_gpus=0): those take `stream`."""
        if self.rank == 0 and self.full is None:
            raise RuntimeError("rank 0 keeps no whole copy of the policy when the generator's engines have processes "
                               "of their own (run.generator_gpus > 0): stream the weights to them (Weights.stream)")
        self.leader.gather()
        if self.rank != 0:
            for _ in self.weights(policy):
                pass
            return None
        own = self.full.state_dict()
        with torch.no_grad():
            for name, tensor in self.weights(policy):
                own[name].copy_(tensor)
        return self.full

    def save(self, learner, folder: Path, tag: int) -> dict:
        """Every rank writes its shards of the weights and AdamW's state (DCP) to folder/learner-<tag>: first
        under a staging name, renamed once all ranks are done."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.leader.save(folder, tag)
        name = SHARDS.format(tag=tag)
        staged, final = folder / f"{name}.partial", folder / name
        if self.rank == 0:
            shutil.rmtree(staged, ignore_errors=True)
        dist.barrier(group=self.group)
        model, optim = get_state_dict(learner.scorer, learner.optimizer)
        dcp.save({"model": model, "optim": optim}, checkpoint_id=staged, process_group=self.group)
        dist.barrier(group=self.group)
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            staged.rename(final)
        dist.barrier(group=self.group)
        return {"learner_shards": name, "scheduler": learner.scheduler.state_dict()}

    def load(self, learner, payload: dict, folder: Path) -> None:
        """Every rank reads its shards back (DCP reshards if the world size changed)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if "learner_shards" not in payload:
            raise ValueError(f"the checkpoint in {folder} was written by one process, not by FSDP ranks: it holds no "
                             "learner shards to load")
        self.leader.load({k: payload[k] for k in ("learner_shards", "scheduler")}, folder)
        model, optim = get_state_dict(learner.scorer, learner.optimizer)
        state = {"model": model, "optim": optim}
        dcp.load(state, checkpoint_id=folder / payload["learner_shards"], process_group=self.group)
        set_state_dict(learner.scorer, learner.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        learner.scheduler.load_state_dict(payload["scheduler"])

    def prune(self, folder: Path, payload: dict) -> None:
        if self.rank == 0:
            for old in folder.glob(SHARDS.format(tag="*")):
                if old.name != payload["learner_shards"]:
                    shutil.rmtree(old, ignore_errors=True)

    def weights(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, gathered one tensor at a time (an all-gather each, in the same order on every rank):
        at most one full tensor exists beside the shards, never the whole model. Every rank must run the iterator to
        its end; the ranks that feed no engine just drop what they get."""
        from torch.distributed.tensor import DTensor

        for name, tensor in policy.state_dict().items():
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def stream(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0: `weights`, with the other trainer ranks taking part in each gather (they follow a "stream")."""
        self.leader.stream()
        yield from self.weights(policy)

    def _reduce(self, value: float, op: str) -> float:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self.group)
        return float(t.item())


class Weights:
    """The trainer's current weights as a generator takes them, whatever the layout holds: `names`, then `stream`,
    (name, full tensor) one at a time (FSDP: gathered from the shards on every trainer rank as they are taken, at
    most one full tensor beside them), for engines that keep their own copy; or `module`, the policy whole (the
    trainer's own in one process; FSDP: rank 0's gathered copy, gathered once per Weights), for what decodes in the
    trainer's process. A step's weights are one Weights: publishing and validating them gather once."""

    def __init__(self, ranks, policy: torch.nn.Module):
        self.ranks, self.policy = ranks, policy
        self._module: torch.nn.Module | None = None

    def names(self) -> list[str]:
        return list(self.policy.state_dict())

    def stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.ranks.stream(self.policy)

    def module(self) -> torch.nn.Module:
        if self._module is None:
            self._module = self.ranks.gathered(self.policy)
        return self._module


def weights_of(policy: torch.nn.Module | Weights) -> Weights:
    """A policy module (a test's, a tool's) as the trainer's Weights are taken; Weights as they are."""
    return policy if isinstance(policy, Weights) else Weights(OneProcess(), policy)
