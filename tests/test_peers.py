"""ablate against TRL 1.16's own GRPOTrainer, on the same inputs: where the two agree (to rounding) and where they
differ (by a ratio derived by hand). docs/peers.md tabulates these tests, one row each.

TRL's side is its real code: a GRPOTrainer on ablate's tiny model (as bench/trl_grpo.py builds it) whose
completions come from TRL's `rollout_func` hook (fixed token ids of chosen lengths, so the masks are known), whose
rewards come from a reward function reading a dataset column, and whose `_generate_and_score_completions` (masks,
advantages, num_items_in_batch), `_prepare_inputs` (the split into steps_per_generation slices) and `compute_loss`
(the model's forward, the loss, the aggregation) run unchanged. Only the behaviour log-probs are set by hand
(`old_per_token_logps`, which TRL takes from its inputs), so that the ratios reach the clip ranges. The gradient
compared is the one with respect to the per-token log-probs TRL's forward returns (captured on their way out).
"""

from __future__ import annotations

import functools
import math
import tempfile
import warnings

import datasets  # the test extra installs trl and datasets: no skip, a missing one fails here
import numpy as np
import pytest
import torch
import trl

from ablate.config import compose
from ablate.registry import build
from ablate.rl import advantages, aggregation
from ablate.rl.checks import LengthWeightedSequenceLoss, warn_on_pairing

G = 4  # completions per prompt in the small batches
LOSS_NAMES = ["cispo", "dapo", "dapo_qwen", "grpo", "gspo"]
AGGREGATIONS = ["prompt_mean", "sample_mean", "token_mean"]


# ---------------------------------------------------------------------------------------------------- TRL's side


@pytest.fixture(scope="module")
def tokenizer():
    from ablate.tasks.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def make_trl(tokenizer):
    """make_trl(**GRPOConfig fields) -> a GRPOTrainer on the tiny model (one per distinct config, all sharing the
    model, whose weights no test changes); `plan["completions"]` holds the completion ids its rollouts return."""
    from omegaconf import OmegaConf

    from ablate.policy import build_policy

    torch.manual_seed(0)
    model = build_policy(OmegaConf.create({"path": None, "vocab_size": len(tokenizer), "hidden_size": 64,
                                           "num_layers": 2, "num_heads": 4, "dtype": "float32"}), seed=0)
    for conf in (model.config, model.generation_config):  # as bench/trl_grpo.py: the tokenizer's special ids
        conf.pad_token_id, conf.bos_token_id, conf.eos_token_id = (tokenizer.pad_token_id, tokenizer.bos_token_id,
                                                                   tokenizer.eos_token_id)
    plan: dict = {}

    def rollout(prompts, trainer):
        assert len(prompts) == len(plan["completions"])
        return {"prompt_ids": [tokenizer(p)["input_ids"] for p in prompts], "completion_ids": plan["completions"],
                "logprobs": None}

    def reward(completions, r, **_):
        return list(r)

    workdir = tempfile.TemporaryDirectory()
    cache: dict = {}

    def make(fresh: bool = False, **overrides):
        key = tuple(sorted(overrides.items()))
        if fresh or key not in cache:
            fields = dict(output_dir=workdir.name, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                          per_device_train_batch_size=2 * G, gradient_accumulation_steps=1, num_generations=G,
                          max_completion_length=8, beta=0.0, use_vllm=False, report_to="none", save_strategy="no",
                          disable_tqdm=True, logging_steps=1, seed=0)
            fields.update(overrides)
            dataset = datasets.Dataset.from_dict({"prompt": ["a"], "r": [0.0]})
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
                trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=trl.GRPOConfig(**fields),
                                          train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = fields["gradient_accumulation_steps"]  # train() sets it
            cache[key] = trainer
        return cache[key]

    make.plan = plan
    yield make
    workdir.cleanup()


def _score(make_trl, trainer, rewards, lengths, *, seed=0, eos_last=None):
    """TRL's `_generate_and_score_completions` on rows of G completions per prompt: completion i has lengths[i]
    random ordinary tokens (ending with eos where eos_last[i]), reward rewards[i]. Rows stay in order."""
    gen = torch.Generator().manual_seed(seed)
    eos = trainer.processing_class.eos_token_id
    completions = []
    for i, n in enumerate(lengths):
        ids = torch.randint(10, len(trainer.processing_class), (n,), generator=gen).tolist()
        if eos_last is not None and eos_last[i]:
            ids[-1] = eos
        completions.append(ids)
    make_trl.plan["completions"] = completions
    rows = [{"prompt": "a b", "r": float(r)} for r in rewards]
    return trainer._generate_and_score_completions(rows)


def _logps(trainer, batch) -> torch.Tensor:
    """The per-token log-probs TRL's forward gives the batch (no grad): the base for hand-set behaviour log-probs."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                                 batch["completion_ids"].size(1))
    return logps


def _trl_loss(trainer, batch):
    """TRL's compute_loss on the batch: (loss, the per-token log-probs its forward produced, d loss / d those)."""
    seen = []
    real = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out[0])
        return out

    trainer._get_per_token_logps_and_entropies = capture
    try:
        loss = trainer.compute_loss(trainer.model, batch)
    finally:
        del trainer._get_per_token_logps_and_entropies
    (logp,) = seen
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    return loss, logp, grad


def _ours(loss_fn, aggregate, logp, old, adv, mask, group):
    value = aggregate(loss_fn(logp, old, adv, mask), mask, group)
    (grad,) = torch.autograd.grad(value, logp, retain_graph=True)
    return value, grad


def _beside_trl(trainer, batch, loss_fn, aggregate, group):
    """TRL's loss and its gradient on `batch`, and ours on the same log-probs: (ours, our grad, TRL's, TRL's grad)."""
    trl_value, logp, trl_grad = _trl_loss(trainer, batch)
    value, grad = _ours(loss_fn, aggregate, logp, batch["old_per_token_logps"], batch["advantages"],
                        batch["completion_mask"].bool(), group)
    return value, grad, trl_value, trl_grad


def _groups(n: int) -> torch.Tensor:
    return torch.arange(n // G).repeat_interleave(G)


@pytest.fixture(scope="module")
def option():
    """option(axis, name) -> the built option, from the config `python -m ablate AXIS=NAME` composes."""

    @functools.cache
    def get(axis: str, name: str):
        node = compose([f"{axis}={name}"])[axis]
        return node, build(node)

    return get


# ------------------------------------------------------------------------------ loss x aggregation: the matrix

def _trl_config(loss: str, hp: dict, level: str) -> dict:
    """TRL's GRPOConfig for ablate's loss with hyper-parameters hp, under a TRL loss_type of aggregation `level`."""
    clip = {"cispo": lambda: dict(epsilon_high=hp["eps_max"]),
            "dapo": lambda: dict(epsilon=hp["eps_low"], epsilon_high=hp["eps_high"]),
            "grpo": lambda: dict(epsilon=hp["eps"]),
            "gspo": lambda: dict(epsilon=hp["eps_low"], epsilon_high=hp["eps_high"],
                                 importance_sampling_level="sequence")}[hp["_target_"].rsplit(".", 1)[1]]()
    return {"loss_type": level, **clip}


# ablate's (loss, aggregation) -> the TRL loss_types that compute it. TRL's cispo is token-level only; TRL has no
# prompt-level aggregation (trl#5375). bnpo is dapo with the local batch's tokens as denominator: the same on one
# process without gradient accumulation.
TRL_PAIRS = {
    ("cispo", "token_mean"): ["cispo"],
    **{(loss, "token_mean"): ["dapo", "bnpo"] for loss in ("dapo", "dapo_qwen", "grpo", "gspo")},
    **{(loss, "sample_mean"): ["grpo"] for loss in ("dapo", "dapo_qwen", "grpo", "gspo")},
}
NO_TRL_PAIR = [(loss, agg) for loss in LOSS_NAMES for agg in AGGREGATIONS if (loss, agg) not in TRL_PAIRS]

# log(pi / pi_old) scale per loss: wide enough for each clip to bite on some tokens (sequences) and not on others
SPREAD = {"cispo": 1.5, "dapo": 0.3, "dapo_qwen": 0.3, "grpo": 0.3, "gspo": 0.006}
LENGTHS = [1, 3, 2, 5, 4, 1, 3, 2]  # unequal within each prompt: token, sample and prompt means all differ
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("loss,agg,loss_type", [(loss, agg, t) for (loss, agg), types in TRL_PAIRS.items()
                                                for t in types])
def test_loss_x_aggregation_matches_trl(make_trl, option, loss, agg, loss_type):
    node, loss_fn = option("loss", loss)
    trainer = make_trl(**_trl_config(loss, dict(node), loss_type))
    batch = _score(make_trl, trainer, REWARDS, LENGTHS)
    gen = torch.Generator().manual_seed(1)
    delta = SPREAD[loss] * torch.randn(batch["completion_ids"].shape, generator=gen)
    batch["old_per_token_logps"] = _logps(trainer, batch) - delta  # log rho = delta (up to the forward's rounding)
    mask = batch["completion_mask"].bool()
    value, grad, trl_value, trl_grad = _beside_trl(trainer, batch, loss_fn, option("aggregation", agg)[1],
                                                   _groups(len(LENGTHS)))
    torch.testing.assert_close(value, trl_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-5, atol=1e-8)
    assert grad[mask].abs().sum() > 0
    # not vacuous: TRL's own metrics say its clip (cap) was active on part of the tokens (sequences), not all
    metrics = trainer._metrics["train"]
    clipped = metrics["cispo_clip_ratio"][-1] if loss_type == "cispo" else metrics["clip_ratio/region_mean"][-1]
    assert 0 < clipped < 1


@pytest.mark.parametrize("loss,agg", NO_TRL_PAIR)
def test_pairs_trl_lacks_weigh_tokens_unlike_trls_nearest(make_trl, option, loss, agg):
    """No TRL counterpart. Against the TRL aggregation nearest to it (sample-level grpo for prompt_mean, the pair
    trl#5375 took for the same; token-level for CISPO), at rho = 1 (no clip anywhere: d loss / d logp_t = -adv_i w_t)
    the gradients differ token by token by the ratio of the weights w, derived from the lengths alone:
        prompt_mean / sample_mean = B T_i / (P L_g)    prompt_mean / token_mean = N / (P L_g)
        sample_mean / token_mean = N / (B T_i)
    with B samples, P prompts, N tokens, T_i sample i's tokens, L_g the tokens of its prompt's samples."""
    node, loss_fn = option("loss", loss)
    level = "cispo" if loss == "cispo" else "grpo"
    trainer = make_trl(**_trl_config(loss, dict(node), level))
    batch = _score(make_trl, trainer, REWARDS, LENGTHS)
    batch.pop("old_per_token_logps", None)  # TRL takes its own detached log-probs: rho = 1
    _, logp, trl_grad = _trl_loss(trainer, batch)
    mask = batch["completion_mask"].bool()
    group = _groups(len(LENGTHS))
    _, grad = _ours(loss_fn, option("aggregation", agg)[1], logp, logp.detach(), batch["advantages"], mask, group)

    T = torch.tensor(LENGTHS, dtype=torch.float32)
    B, P, N = len(LENGTHS), len(LENGTHS) // G, T.sum()
    L = torch.zeros(P).index_add(0, group, T)[group]
    w_ours = {"prompt_mean": 1 / (P * L), "sample_mean": 1 / (B * T), "token_mean": 1 / N * torch.ones(B)}[agg]
    w_trl = 1 / N * torch.ones(B) if level == "cispo" else 1 / (B * T)
    ratio = (w_ours / w_trl)[:, None].expand_as(mask)
    torch.testing.assert_close(grad[mask], trl_grad[mask] * ratio[mask], rtol=1e-5, atol=1e-8)
    assert not torch.allclose(ratio[mask], torch.ones(()))  # the weights really differ on this batch


def test_prompt_mean_equals_trls_grpo_when_a_prompts_samples_have_one_length(make_trl, option):
    """The case trl#5375 had in mind: with equal lengths within each prompt, prompt_mean is TRL's grpo."""
    node, loss_fn = option("loss", "dapo")
    trainer = make_trl(**_trl_config("dapo", dict(node), "grpo"))
    lengths = [3] * G + [5] * G
    batch = _score(make_trl, trainer, REWARDS, lengths)
    batch["old_per_token_logps"] = _logps(trainer, batch) - 0.3 * torch.randn(
        batch["completion_ids"].shape, generator=torch.Generator().manual_seed(2))
    value, grad, trl_value, trl_grad = _beside_trl(trainer, batch, loss_fn, aggregation.prompt_mean,
                                                   _groups(len(lengths)))
    torch.testing.assert_close(value, trl_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------------------------------ advantage normalization

NORM_REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
# group 0: mean 0.25, centred [.75, -.25, -.25, -.25]; group 1: mean 0.75, centred [.25, .25, -.75, .25];
# each group's unbiased std sqrt(0.75 / 3) = 0.5
CENTRED = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])


def test_normalization_none_matches_trl_scale_rewards_none(make_trl):
    trl_adv = _score(make_trl, make_trl(scale_rewards="none"), NORM_REWARDS, [2] * 8)["advantages"]
    ours = advantages.none(torch.tensor(NORM_REWARDS), _groups(8))
    torch.testing.assert_close(ours, trl_adv, rtol=0, atol=0)
    torch.testing.assert_close(ours, CENTRED, rtol=0, atol=0)


def test_normalization_prompt_is_trl_group_but_for_eps(make_trl, option):
    """The same formula (unbiased group std); eps 1e-6 (ours, normalization.eps) against TRL's fixed 1e-4: ours are
    TRL's x (std + 1e-4) / (std + 1e-6), here (0.5 + 1e-4) / (0.5 + 1e-6) = 1 + 1.98e-4; normalization.eps=1e-4
    gives TRL's."""
    node, normalize = option("normalization", "prompt")
    assert node.eps == 1e-6
    trl_adv = _score(make_trl, make_trl(scale_rewards="group"), NORM_REWARDS, [2] * 8)["advantages"]
    torch.testing.assert_close(trl_adv, CENTRED / (0.5 + 1e-4), rtol=1e-6, atol=0)
    ours = normalize(torch.tensor(NORM_REWARDS), _groups(8))
    torch.testing.assert_close(ours / trl_adv, torch.full((8,), (0.5 + 1e-4) / (0.5 + 1e-6)), rtol=1e-6, atol=0)
    assert (ours / trl_adv).mean().item() == pytest.approx(1 + 1.98e-4, abs=1e-6)
    torch.testing.assert_close(advantages.prompt(torch.tensor(NORM_REWARDS), _groups(8), eps=1e-4), trl_adv,
                               rtol=1e-6, atol=0)


def test_normalization_batch_divides_by_the_centred_std_trl_by_the_raw_rewards_std(make_trl, option):
    """ScaleRL's batch: the group-centred rewards / the std of those centred values over the batch. TRL's
    scale_rewards="batch": the same centred rewards / the std of the raw rewards over the batch. Here the raw
    rewards (mean 0.5) have sum of squares 8 x 0.25 = 2, the centred ones 2 x 0.5625 + 6 x 0.0625 = 1.5 (unbiased,
    both / 7): ours are TRL's x sqrt(2 / 1.5) = 1.1547 (with the eps: (sqrt(2/7) + 1e-4) / (sqrt(1.5/7) + 1e-6))."""
    _, normalize = option("normalization", "batch")
    trl_adv = _score(make_trl, make_trl(scale_rewards="batch"), NORM_REWARDS, [2] * 8)["advantages"]
    torch.testing.assert_close(trl_adv, CENTRED / (math.sqrt(2 / 7) + 1e-4), rtol=1e-6, atol=0)
    ours = normalize(torch.tensor(NORM_REWARDS), _groups(8))
    torch.testing.assert_close(ours, CENTRED / (math.sqrt(1.5 / 7) + 1e-6), rtol=1e-6, atol=0)
    ratio = (math.sqrt(2 / 7) + 1e-4) / (math.sqrt(1.5 / 7) + 1e-6)
    torch.testing.assert_close(ours / trl_adv, torch.full((8,), ratio), rtol=1e-6, atol=0)
    assert ratio == pytest.approx(math.sqrt(4 / 3), rel=3e-4)


def test_normalization_batch_against_trl_at_scalerls_batch_shape(make_trl, option):
    """48 prompts x 16 completions, +-1 rewards, each prompt's pass rate uniform in [0, 1], 40 batches through
    TRL's own code. Total = within-prompt + between-prompt sum of squares, so ours / TRL's = sqrt(1 + between /
    within) >= 1 (up to the eps), equal only when every prompt has the same mean reward; its size varies batch to
    batch with the spread of the pass rates."""
    _, normalize = option("normalization", "batch")
    trainer = make_trl(per_device_train_batch_size=768, num_generations=16, scale_rewards="batch")
    rng = np.random.default_rng(0)
    group = torch.arange(48).repeat_interleave(16)
    ratios, filtered = [], []
    for _ in range(40):
        p = rng.uniform(size=(48, 1))
        rewards = torch.tensor(np.where(rng.uniform(size=(48, 16)) < p, 1.0, -1.0).ravel(), dtype=torch.float32)
        trl_adv = _score(make_trl, trainer, rewards.tolist(), [1] * 768)["advantages"]
        ours = normalize(rewards, group)
        moved = trl_adv.abs() > 0
        ratio = ours[moved] / trl_adv[moved]
        assert ratio.max() - ratio.min() < 1e-5  # one factor for the whole batch
        r = rewards.double()
        mean = torch.zeros(48, dtype=torch.float64).index_add(0, group, r)[group] / 16
        within, total = ((r - mean) ** 2).sum(), ((r - r.mean()) ** 2).sum()
        assert ratio.mean().item() == pytest.approx(math.sqrt(total / within), rel=2e-4)
        ratios.append(ratio.mean().item())
        # as the trainer runs it with zero-variance filtering: both on the kept prompts only
        kept = (torch.zeros(48).index_add(0, group, (r - mean).abs().float()) > 0)[group]
        kept_group = torch.unique(group[kept], return_inverse=True)[1]
        centred = r[kept] - mean[kept]
        filtered.append(((r[kept].std() + 1e-4) / (centred.std() + 1e-6)).item())  # ours / TRL's
        torch.testing.assert_close(normalize(rewards[kept], kept_group).double(), centred / (centred.std() + 1e-6),
                                   rtol=1e-5, atol=1e-6)
    ratios, filtered = np.array(ratios), np.array(filtered)
    # 20,000 such batches (numpy, the same formulas): median 1.26, 5-95% 1.19-1.35 on the whole batch; on the kept
    # prompts median 1.18, 5-95% 1.13-1.24. These 40 (seed 0): median 1.25, 1.16-1.38; kept: 1.18, 1.12-1.27
    assert 1.22 < np.median(ratios) < 1.30 and 1.10 < ratios.min() and ratios.max() < 1.50
    assert 1.15 < np.median(filtered) < 1.22 and 1.05 < filtered.min() and filtered.max() < 1.40


# ------------------------------------------------------------------------------------------------------------ GSPO


def test_gspo_under_a_length_weighted_aggregation_warns(option):
    gspo, cispo = option("loss", "gspo")[0], option("loss", "cispo")[0]
    prompt_mean, sample_mean = option("aggregation", "prompt_mean")[0], option("aggregation", "sample_mean")[0]
    token_mean = option("aggregation", "token_mean")[0]
    with pytest.warns(LengthWeightedSequenceLoss, match="loss=gspo .* aggregation=prompt_mean"):
        assert warn_on_pairing(gspo, prompt_mean)
    with pytest.warns(LengthWeightedSequenceLoss, match="aggregation=token_mean"):
        assert warn_on_pairing(gspo, token_mean)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_on_pairing(gspo, sample_mean)
        assert not warn_on_pairing(cispo, prompt_mean)
    # the built options (functools.partial of the functions) are read the same way
    with pytest.warns(LengthWeightedSequenceLoss):
        assert warn_on_pairing(option("loss", "gspo")[1], option("aggregation", "prompt_mean")[1])


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_loss_declares_sequence_level_as_it_computes(option, name):
    """sequence_level: every token of a sample carries the same per-token loss, whatever the log-probs."""
    node, loss_fn = option("loss", name)
    gen = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    old = torch.log(torch.rand(2, 4, generator=gen))
    per_token = loss_fn(old + 0.004 * torch.randn(2, 4, generator=gen), old, torch.tensor([1.0, -1.0]), mask)
    constant = all(torch.allclose(row[m], row[m][0].expand(int(m.sum()))) for row, m in zip(per_token, mask))
    from hydra.utils import get_object

    assert getattr(get_object(node._target_), "sequence_level") is constant


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_an_aggregation_declares_length_weighted_as_it_computes(option, name):
    """length_weighted: a per-sequence-constant loss weighs a sample of 3 tokens 3 times one of 1 token."""
    node, aggregate = option("aggregation", name)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    weights = aggregation.token_weights(aggregate, mask, torch.tensor([0, 0])).sum(dim=1)
    from hydra.utils import get_object

    assert getattr(get_object(node._target_), "length_weighted") is bool(weights[1] / weights[0] > 2.5)


def test_trl_warns_too_for_its_sequence_level_token_losses(make_trl, caplog):
    """TRL's own warning, at construction: sequence-level importance sampling with a token-level loss_type."""
    with caplog.at_level("WARNING"):
        make_trl(fresh=True, loss_type="dapo", importance_sampling_level="sequence", epsilon=3e-3, epsilon_high=5e-3)
    assert "weights each sequence by its completion length" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trl(fresh=True, loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-3, epsilon_high=5e-3)
    assert "weights each sequence by its completion length" not in caplog.text


# ------------------------------------------------------------------------------------- fully masked rows (sample_mean)


def test_sample_mean_leaves_a_fully_masked_row_out_where_trl_counts_it(make_trl, option):
    """TRL masks a truncated completion wholly (mask_truncated_completions=True; ablate's zero-variance filtering
    masks rows the same way). TRL's grpo divides by all B rows, the masked one included; ablate's sample_mean by the
    rows with a token: ours = TRL's x B / (B - 1) = 12 / 11 in value and gradient. token_mean agrees with TRL's dapo."""
    node, loss_fn = option("loss", "dapo")
    lengths = [3, 2, 4, 1, 2, 2, 5, 3, 1, 4, 2, 3]
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    eos_last = [True] * 12
    eos_last[6] = False  # truncated: TRL masks the row
    for level, agg, factor in (("grpo", aggregation.sample_mean, 12 / 11), ("dapo", aggregation.token_mean, 1.0)):
        trainer = make_trl(**_trl_config("dapo", dict(node), level), per_device_train_batch_size=12,
                           mask_truncated_completions=True)
        batch = _score(make_trl, trainer, rewards, lengths, eos_last=eos_last)
        mask = batch["completion_mask"].bool()
        assert mask.any(dim=1).tolist() == eos_last
        batch["old_per_token_logps"] = _logps(trainer, batch) - 0.3 * torch.randn(
            mask.shape, generator=torch.Generator().manual_seed(3))
        value, grad, trl_value, trl_grad = _beside_trl(trainer, batch, loss_fn, agg, _groups(12))
        torch.testing.assert_close(value, trl_value * factor, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(grad, trl_grad * factor, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------------------------- PPO-off-policy-k: denominators

K = 2
KB_REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0,  # batch 1 (the first B = 8 rows): as NORM_REWARDS
              1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # batch 2: centred [.5 .5 -.5 -.5], [-.5 -.5 .5 .5]
KB_LENGTHS = [1, 3, 2, 5, 4, 1, 3, 2, 6, 2, 2, 1, 3, 4, 1, 5]


def test_ppo_off_policy_k_trl_token_denominator_spans_the_generation_batch(make_trl, option):
    """PPO-off-policy-k as TRL runs it: steps_per_generation = k, one generation of k x B completions, k optimizer
    steps. TRL's dapo/cispo divide each step's token sum by num_items_in_batch (the k x B completions' tokens) / k;
    ablate's token_mean by the step's own tokens: ours = TRL's x N_gen / (k N_step). Its grpo (sample-level)
    divides by the step's own rows: the same as ours."""
    node, loss_fn = option("loss", "dapo")
    n_gen = sum(KB_LENGTHS)
    for level, agg in (("dapo", aggregation.token_mean), ("grpo", aggregation.sample_mean)):
        trainer = make_trl(**_trl_config("dapo", dict(node), level), steps_per_generation=K)
        torch.manual_seed(5)  # TRL shuffles the generation batch before cutting it into k steps
        trainer._step, trainer._buffered_inputs = 0, None
        rows = [{"prompt": "a b", "r": r} for r in KB_REWARDS]
        gen = torch.Generator().manual_seed(0)
        make_trl.plan["completions"] = [torch.randint(10, 100, (n,), generator=gen).tolist() for n in KB_LENGTHS]
        steps = []
        for step in range(K):
            trainer._step = step
            steps.append(trainer._prepare_inputs(rows))
        assert int(steps[0]["num_items_in_batch"]) == n_gen  # the whole generation batch's tokens, in each step
        sizes = [int(s["completion_mask"].sum()) for s in steps]
        assert sum(sizes) == n_gen and sizes[0] != sizes[1]
        for batch, n_step in zip(steps, sizes):
            assert "old_per_token_logps" in batch  # TRL's own forward: k > 1 steps per generation
            # rows are shuffled across the k steps, groups split: per-row aggregations need no group ids
            value, grad, trl_value, trl_grad = _beside_trl(trainer, batch, loss_fn, agg,
                                                           torch.arange(len(batch["advantages"])))
            factor = n_gen / (K * n_step) if level == "dapo" else 1.0
            torch.testing.assert_close(value, trl_value * factor, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(grad, trl_grad * factor, rtol=1e-5, atol=1e-8)


def test_ppo_off_policy_k_trl_batch_std_spans_the_generation_batch(make_trl, option):
    """TRL normalizes the k x B generation batch at once (scale_rewards="batch": the std of its 16 raw rewards, half
    of them 1: sum of squares 16 x 0.25 = 4, sqrt(4 / 15)); ablate normalizes each optimizer step's own B completions
    by the std of their centred rewards: batch 1 sqrt(1.5 / 7), batch 2 (sum of squares 8 x 0.25) sqrt(2 / 7).
    Ours / TRL's: 1.116 on the first step, 0.966 on the second (either way)."""
    _, normalize = option("normalization", "batch")
    trainer = make_trl(scale_rewards="batch", steps_per_generation=K)
    trl_adv = _score(make_trl, trainer, KB_REWARDS, KB_LENGTHS)["advantages"]
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25,
                            0.5, 0.5, -0.5, -0.5, -0.5, -0.5, 0.5, 0.5])
    torch.testing.assert_close(trl_adv, centred / (math.sqrt(4 / 15) + 1e-4), rtol=1e-6, atol=0)
    rewards = torch.tensor(KB_REWARDS)
    first, second = normalize(rewards[:8], _groups(8)), normalize(rewards[8:], _groups(8))
    torch.testing.assert_close(first, centred[:8] / (math.sqrt(1.5 / 7) + 1e-6), rtol=1e-6, atol=0)
    torch.testing.assert_close(second, centred[8:] / (math.sqrt(2 / 7) + 1e-6), rtol=1e-6, atol=0)
    trl_scale = math.sqrt(4 / 15) + 1e-4
    torch.testing.assert_close(first / trl_adv[:8], torch.full((8,), trl_scale / (math.sqrt(1.5 / 7) + 1e-6)),
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(second / trl_adv[8:], torch.full((8,), trl_scale / (math.sqrt(2 / 7) + 1e-6)),
                               rtol=1e-6, atol=0)
    assert trl_scale / math.sqrt(1.5 / 7) == pytest.approx(1.116, abs=1e-3)
    assert trl_scale / math.sqrt(2 / 7) == pytest.approx(0.966, abs=1e-3)


def test_trl_num_iterations_keeps_each_batchs_own_denominator(make_trl, option):
    """num_iterations (TRL's mu: the same batch trained on mu times) does not widen the denominator: with
    steps_per_generation = 1 TRL's dapo is ablate's token_mean on the batch, to rounding."""
    node, loss_fn = option("loss", "dapo")
    trainer = make_trl(**_trl_config("dapo", dict(node), "dapo"), num_iterations=2)
    batch = _score(make_trl, trainer, REWARDS, LENGTHS)
    assert "old_per_token_logps" in batch  # TRL's own forward: the batch is revisited
    batch["old_per_token_logps"] = batch["old_per_token_logps"] - 0.3 * torch.randn(
        batch["completion_ids"].shape, generator=torch.Generator().manual_seed(6))
    value, grad, trl_value, trl_grad = _beside_trl(trainer, batch, loss_fn, aggregation.token_mean,
                                                   _groups(len(LENGTHS)))
    torch.testing.assert_close(value, trl_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-5, atol=1e-8)
