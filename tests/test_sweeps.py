"""Sweeps are derived from data: the LOO sweep from the axis table, the recipes sweep from its list."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import OmegaConf

from ablate.config import choice_of, compose, merge_overrides, semantic, signature
from ablate.run import plan, sweep_id
from ablate.sweeps import loo, single

PAPER_LOO = {  # docs/design.md#what-the-paper-says (the LOO variants), plus loo-npr
    "loo-dapo": "loss=dapo",
    "loo-savg": "aggregation=sample_mean",
    "loo-plan": "normalization=prompt",
    "loo-fp32": "precision=bf16",
    "loo-lp": "length_control=length_penalty",
    "loo-8op": "off_policy=ppo_off_policy",
    "loo-batch": "filtering.zero_variance=false",
    "loo-npr": "filtering.no_positive_resampling=false",
}


def test_loo_emits_scalerl_and_the_paper_variants():
    variants = loo(compose(["sweep=loo"]))
    assert variants[0].name == "scalerl" and variants[0].overrides == ()
    assert {v.name: " ".join(v.overrides) for v in variants[1:]} == PAPER_LOO
    assert len(variants) == 9


def test_loo_variant_configs_differ_from_scalerl_on_their_axis_only():
    planned = {p.variant.name: p for p in plan(compose(["sweep=loo"]), ["sweep=loo"])}
    base = semantic(planned["scalerl"].cfg)
    for name, override in PAPER_LOO.items():
        cfg = planned[name].cfg
        path, value = override.split("=")
        assert choice_of(cfg, path) == value
        changed = {k for k in base if base[k] != semantic(cfg)[k]}
        assert changed == {path.split(".")[0]}, (name, changed)
    assert len({p.signature for p in planned.values()}) == 9


def test_a_recipe_already_on_the_base_choice_loses_that_variant():
    names = [v.name for v in loo(compose(["sweep=loo", "loss=dapo"]))]
    assert "loo-dapo" not in names and len(names) == 8
    names = [v.name for v in loo(compose(["sweep=loo", "recipe=qwen_dapo"]))]
    # qwen_dapo: dapo_qwen loss (not the base dapo), prompt mean, prompt norm, bf16, length penalty, PPO-off-policy,
    # zero-variance filtering on, NPR off -> differs from the base on loss, aggregation and zero-variance only.
    assert names == ["scalerl", "loo-dapo", "loo-savg", "loo-batch"]


def test_an_extra_axis_in_a_config_of_ones_own_gets_a_variant(tmp_path: Path):
    """A user's config folder adds a loss option and an axis table with two more axes: no code changes."""
    (tmp_path / "loss").mkdir()
    (tmp_path / "loss" / "my_loss.yaml").write_text(
        "defaults: [/schema/loss/dapo@_here_, _self_]\nname: my_loss\n_target_: ablate.rl.losses.dapo\n")
    (tmp_path / "axes").mkdir()
    paper = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "axes" / "paper.yaml")
    extra = [{"path": "optim.warmup_steps", "base": 0, "variant": "loo-warmup"},
             {"path": "loss", "base": "my_loss", "variant": "loo-mine"}]
    table = {"axes": [*OmegaConf.to_container(paper.axes)[1:], *extra]}  # and without the loss/dapo line
    (tmp_path / "axes" / "extended.yaml").write_text("# @package _global_\n" + OmegaConf.to_yaml(table))
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "axes=extended", "sweep=loo"]
    variants = loo(compose(overrides))
    assert [v.name for v in variants] == ["scalerl", *list(PAPER_LOO)[1:], "loo-warmup", "loo-mine"]
    assert variants[-2].overrides == ("optim.warmup_steps=0",)
    planned = plan(compose(overrides), overrides)
    assert planned[-2].cfg.optim.warmup_steps == 0 and planned[0].cfg.optim.warmup_steps == 10
    assert planned[-1].cfg.loss.name == "my_loss" and planned[-1].cfg.loss.eps_high == 0.28


def test_recipes_sweep_emits_the_five_recipes():
    planned = plan(compose(["sweep=recipes"]), ["sweep=recipes"])
    assert [p.variant.name for p in planned] == ["scalerl", "deepseek_grpo", "qwen_dapo", "magistral", "minimax_m1"]
    assert len({p.signature for p in planned}) == 5
    assert choice_of(planned[1].cfg, "loss") == "grpo" and choice_of(planned[4].cfg, "loss") == "cispo"
    # the recipes sweep's scalerl is the LOO sweep's scalerl: the same run
    loo_planned = plan(compose(["sweep=loo"]), ["sweep=loo"])
    assert planned[0].signature == loo_planned[0].signature


def test_command_line_overrides_apply_to_every_variant():
    planned = plan(compose(["sweep=loo", "seed=3"]), ["sweep=loo", "seed=3"])
    assert all(p.cfg.seed == 3 for p in planned)
    plain = plan(compose(["sweep=loo"]), ["sweep=loo"])
    assert not {p.signature for p in planned} & {p.signature for p in plain}


def test_a_variant_override_replaces_the_command_lines_on_the_same_key():
    assert merge_overrides(["loss=grpo", "seed=3"], ["loss=dapo"]) == ["seed=3", "loss=dapo"]
    assert merge_overrides(["loss.eps_max=5", "lossy=1"], ["loss=dapo"]) == ["lossy=1", "loss=dapo"]
    planned = {p.variant.name: p for p in plan(compose(["sweep=loo", "loss=gspo"]), ["sweep=loo", "loss=gspo"])}
    assert choice_of(planned["scalerl"].cfg, "loss") == "gspo"
    assert choice_of(planned["loo-dapo"].cfg, "loss") == "dapo"


def test_sweep_id_is_the_same_for_the_same_sweep():
    a = plan(compose(["sweep=loo"]), ["sweep=loo"])
    b = plan(compose(["sweep=loo", "launcher=debug"]), ["sweep=loo", "launcher=debug"])
    cfg = compose(["sweep=loo"])
    assert sweep_id(cfg, a) == sweep_id(cfg, b)
    digest = hashlib.sha256(" ".join(sorted(p.signature for p in a)).encode()).hexdigest()[:6]
    assert sweep_id(cfg, a) == f"loo-{digest}"


def test_single_run_is_named_after_its_recipe_and_hand_changes():
    assert single(compose([]), [])[0].name == "scalerl"
    assert single(compose(["loss=dapo"]), ["loss=dapo", "seed=2"])[0].name == "scalerl[loss=dapo]"
    assert single(compose(["recipe=magistral"]), ["recipe=magistral"])[0].name == "magistral"


# ----------------------------------------------------------------------------------------------------- signatures
def test_signature_is_sha256_of_the_canonical_semantic_config():
    cfg = compose([])
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for key in ("name", "paths", "run", "launcher", "tracking", "sweep", "axes", "untestable"):
        container.pop(key)
    expected = hashlib.sha256(json.dumps(container, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert signature(cfg) == expected[:12]


def test_signature_ignores_launcher_tracking_and_paths():
    base = signature(compose([]))
    for overrides in (["launcher=slurm"], ["launcher=debug", "launcher.folder=/elsewhere"], ["paths.runs=/scratch"],
                      ["tracking.uri=http://tracking:5000"], ["name=other"], ["sweep=loo"]):
        assert signature(compose(overrides)) == base, overrides


def test_signature_ignores_key_order_and_sees_every_semantic_value():
    cfg = compose([])
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    reordered = OmegaConf.create(_reverse(container))
    assert list(reordered.keys()) != list(cfg.keys())
    assert signature(reordered) == signature(cfg)
    for overrides in (["seed=1"], ["loss.eps_max=5"], ["generator.max_waves=3"], ["task.teacher_accuracy=0.5"],
                      ["generator=mock"], ["batch.prompts_per_step=9"]):
        assert signature(compose(overrides)) != signature(cfg), overrides


def _reverse(value):
    if isinstance(value, dict):
        return {k: _reverse(value[k]) for k in reversed(list(value))}
    return value


def test_what_a_re_sweep_does_with_each_variant():
    from types import SimpleNamespace

    from ablate.run import _decide

    def run(run_id, status, tags=None):
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status), data=SimpleNamespace(tags=tags or {}))

    saved = {"b", "c"}.__contains__  # runs b and c left a checkpoint
    assert _decide([run("a", "FAILED"), run("z", "FINISHED")], {}, saved) == ("finished", "z")
    # stopped by an adaptive sweep: continued with sweep.extend=true, if it kept its checkpoint
    settled = {"ablate.settled_at": "12"}
    assert _decide([run("b", "FINISHED", settled)], {}, saved, extend=True) == ("extend", "b")
    assert _decide([run("b", "FINISHED", settled)], {}, saved) == ("finished", "b")
    assert _decide([run("z", "FINISHED", settled)], {}, saved, extend=True) == ("finished", "z")
    assert _decide([run("b", "FINISHED")], {}, saved, extend=True) == ("finished", "b")  # ran its budget
    assert _decide([run("b", "RUNNING")], {"b": ("12_0", "RUNNING")}, saved) == ("alive", "b")
    assert _decide([run("b", "RUNNING")], {"b": ("12_0", "CANCELLED")}, saved) == ("resume", "b")
    # the newest unfinished run has no checkpoint: an older one that has is resumed
    assert _decide([run("a", "FAILED"), run("c", "KILLED")], {}, saved) == ("resume", "c")
    # no checkpoint at all: a fresh run (continuing one from step 0 would log its steps twice)
    assert _decide([run("a", "FAILED")], {}, saved) == ("new", None)
    assert _decide([], {}, saved) == ("new", None)


def test_a_variant_this_scale_cannot_test_is_tagged_with_why_unless_simulated():
    """experiment=tiny lists precision (fp32 model, the same kernels on both sides), length control (answers of 4-5
    tokens never reach a budget) and aggregation (equal lengths: the same loss) as untestable: their variants carry
    the reason to the report; the mock, which plays the paper's scale, gets no such tag."""
    from ablate.run import variant_tags

    real = {p.variant.name: variant_tags(p, "s") for p in plan(compose(["sweep=loo"]), ["sweep=loo"])}
    assert "fp32 LM head" in real["loo-fp32"]["ablate.untestable"]
    assert "thinking budget is never reached" in real["loo-lp"]["ablate.untestable"]
    assert "weigh every token alike" in real["loo-savg"]["ablate.untestable"]
    assert sorted(name for name, tags in real.items() if "ablate.untestable" in tags) == ["loo-fp32", "loo-lp",
                                                                                          "loo-savg"]
    mock = plan(compose(["sweep=loo", "generator=mock"]), ["sweep=loo", "generator=mock"])
    assert not any("ablate.untestable" in variant_tags(p, "s") for p in mock)


def test_seeds_of_each_variant_and_replicates_of_the_base_are_runs_of_their_own():
    """sweep.seeds=2 sweep.base_seeds=3 seed=5: each variant at seeds 5 and 6, scalerl at 5, 6 and 7; the seeds of a
    variant share its name (the report fits them together) and differ only in the seed; each has its own run
    (signature) and label."""
    overrides = ["sweep=loo", "seed=5", "sweep.seeds=2", "sweep.base_seeds=3"]
    planned = plan(compose(overrides), overrides)
    labels = [p.variant.label for p in planned]
    assert labels[:4] == ["scalerl", "scalerl seed+1", "scalerl seed+2", "loo-dapo"]
    assert len(planned) == 3 + 2 * 8 and len(set(labels)) == len(labels)
    assert len({p.signature for p in planned}) == len(planned)
    seeds = {p.variant.label: int(p.cfg.seed) for p in planned}
    assert (seeds["scalerl"], seeds["scalerl seed+2"], seeds["loo-npr"], seeds["loo-npr seed+1"]) == (5, 7, 5, 6)
    dapo = [p for p in planned if p.variant.name == "loo-dapo"]
    first, second = (semantic(p.cfg) for p in dapo)
    assert {k for k in first if first[k] != second[k]} == {"seed"}
    assert all(p.cfg.loss.name == "dapo" for p in dapo)


def test_an_adaptive_sweep_with_seeds_it_cannot_run_is_refused_before_anything_is_submitted(tmp_path: Path):
    """sweep.adaptive=true with several seeds is the adaptive sweep with seeds (ablate/seeding.py): its looks are
    about the recipes, at least one, and need a fixed design to spend against; each refusal names its key. Before,
    any adaptive sweep of several seeds was refused."""
    from conftest import run_main

    common = ["-m", "ablate", "sweep=loo", "generator=mock", "sweep.adaptive=true", "sweep.base_seeds=2",
              "sweep.dry_run=true"]
    for extra, said in ((["sweep.level=runs"], "sweep.level=recipes, not runs"),
                        (["sweep.looks=0"], "sweep.looks=0: the adaptive sweep with seeds takes 1 look or more"),
                        (["sweep.futility=1.5"], "futility")):
        out = run_main(*common, *extra, cwd=tmp_path)
        assert out.returncode == 2 and said in out.stderr.strip().splitlines()[-1], (extra, out.stderr[-500:])
    assert run_main(*common, cwd=tmp_path).returncode == 0


def test_the_dry_run_prints_what_each_design_resolves_from_the_model_its_power_comes_from(tmp_path: Path):
    """Per design, in one table: the resolution on A between runs and between recipes, the power and the GPU-hours,
    all from analysis.design's answer for the mock's 50 points of 1,000 x 16, the prior spread and the mock's
    GPU-hours (16,000 a run); before, the resolutions came from a second noise model (the Gaussian limit without the
    fitter's excess) in a table of their own. Two half-length seeds beat one full one between recipes at the
    paper's spread and lose between runs, for the same GPU-hours."""
    from conftest import run_main

    from analysis.design import DESIGNS, Question, answer, run_sds

    out = run_main("-m", "ablate", "sweep=loo", "generator=mock", "sweep.dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line[2:].split("  ")[0].strip(): line.split() for line in out.stdout.splitlines()
            if line.startswith("  ") and "of the budget" in line}
    assert "designs:" not in out.stdout  # one table, not two
    got = {}
    for d in DESIGNS:
        a = answer(d, Question(margin_A=0.02), sds=run_sds(d.fraction, points=50), hours=(8 * 16000.0, 16000.0))
        runs, recipes, power, _, _, hours = rows[d.name][-6:]
        assert (runs, recipes, power) == (f"{a.resolution[0]:.3f}", f"{a.resolution[1]:.3f}", f"{a.power_A:.2f}")
        assert hours == f"{a.gpu_hours:,.0f}"
        got[d.name] = a
    one, two = got["one seed, full budget"], got["two seeds, half the budget each"]
    assert two.resolution[1] < one.resolution[1] and two.resolution[0] > one.resolution[0]
    assert two.gpu_hours == one.gpu_hours == 144_000
    assert rows["this sweep"][-6:] == rows["one seed, full budget"][-6:]


def test_a_config_folder_of_ones_own_reaches_every_variant_from_the_command_line(tmp_path: Path):
    """`--config-dir` or `hydra.searchpath` on `python -m ablate`'s command line: before, the sweep's variants were
    composed without it and the command failed (Could not find 'model/mine')."""
    from conftest import run_main

    folder = tmp_path / "conf"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "mine.yaml").write_text("defaults: [/schema/model/option@_here_, _self_]\nname: mine\n"
                                                "path: null\nhidden_size: 48\nnum_layers: 1\nnum_heads: 2\n")
    overrides = [f"hydra.searchpath=[file://{folder}]", "model=mine", "sweep=loo"]
    planned = plan(compose(overrides), overrides)
    expected = {p.variant.label: p.signature for p in planned}
    assert all(p.cfg.model.hidden_size == 48 for p in planned)
    for how in ([f"hydra.searchpath=[file://{folder}]"], ["--config-dir", str(folder)]):
        out = run_main("-m", "ablate", *how, "model=mine", "sweep=loo", "sweep.dry_run=true", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        printed = {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines()
                   if line.startswith(("  scalerl", "  loo-"))}
        assert printed == expected


def test_a_sweeps_time_is_told_phase_by_phase_in_the_order_they_ran():
    """What `python -m ablate sweep=...` prints as its harness time and, watched, at its end: each phase's seconds
    since the last one ended (a phase met twice adds up), and the total from the sweep's start."""
    from ablate.run import Phases

    clock = iter([10.0, 12.5, 16.0, 17.0, 17.25, 37.25])
    phases = Phases(clock=lambda: next(clock))
    phases.done("composing")  # 2.5
    phases.done("checks")  # 3.5
    phases.done("composing")  # 1.0 more
    phases.done("submitting")  # 0.25
    phases.done("the runs")  # 20.0
    assert phases.seconds == {"composing": 3.5, "checks": 3.5, "submitting": 0.25, "the runs": 20.0}
    assert phases.total == 27.25
    assert str(phases) == "3.5 s composing, 3.5 s checks, 0.2 s submitting, 20.0 s the runs"
