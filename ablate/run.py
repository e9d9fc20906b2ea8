"""What `python -m ablate` does: one run in the foreground, or a sweep of variants submitted as one job array.

    compose the base config -> the sweep emits variants (name, overrides) -> compose each -> signature
    -> the pre-flight (ablate/preflight.py: one run's and a sweep's checks alike) -> MLflow parent run for the sweep
    -> skip variants FINISHED with the same signature -> submit the rest
    -> (local) watch with a progress display -> report
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from ablate import seeding, tracking
from ablate.config import compose, lineage, merge_overrides, override_key, signature
from ablate.preflight import check_before_submit, print_found
from ablate.progress import StepBar, SweepDisplay, hours
from ablate.rungs import check_settings
from ablate.sweeps import Variant, replicate
from analysis.report import SPREAD_TAG
from analysis.runs import END_REASON_TAG, EXTENDED_TAG, SETTLED_TAG
from analysis.spread import MARGIN_A, Spread
from launch.status import ALIVE, job_states
from launch.submit import JobSpec, Submission, resolve_cluster, submit


@dataclass
class Planned:
    variant: Variant
    cfg: DictConfig
    signature: str
    lineage: str = ""  # the signature less train.steps (ablate/config.py)


def plan(cfg: DictConfig, overrides: Sequence[str], counts: dict[str, int] | None = None) -> list[Planned]:
    """The sweep's variants, each composed from the command line's overrides followed by its own; `counts`: a
    variant's seeds where more than sweep.seeds (sweep.base_seeds) asks (seeds_to_settle)."""
    emit = get_method(cfg.sweep.emit)
    base = [o for o in overrides if not override_key(o).startswith("sweep")]
    variants = emit(cfg, overrides)
    if cfg.sweep.name != "none":
        variants = replicate(variants, int(cfg.seed), int(cfg.sweep.seeds), int(cfg.sweep.base_seeds), counts)
    planned = []
    for variant in variants:
        variant_cfg = compose(merge_overrides(base, variant.overrides)) if variant.overrides else cfg
        planned.append(Planned(variant, variant_cfg, signature(variant_cfg), lineage(variant_cfg)))
    names = [p.variant.label for p in planned]
    if len(set(names)) != len(names):
        raise ValueError(f"the sweep emits duplicate variant names: {names}")
    return planned


def sweep_id(cfg: DictConfig, planned: Sequence[Planned]) -> str:
    """loo-3fa2c1: the sweep's kind and a hash of its variants' signatures at the command line's seed (the same
    sweep gets the same id, with more seeds of any variant too: they go on in the same sweep)."""
    first = [p.signature for p in planned if not p.variant.replica]
    digest = hashlib.sha256(" ".join(sorted(first)).encode()).hexdigest()[:6]
    return f"{cfg.sweep.name}-{digest}"


def print_plan(planned: Sequence[Planned], title: str) -> None:
    rows = [("variant", "overrides", "signature")]
    rows += [(p.variant.label, " ".join(p.variant.overrides) or "(the recipe)", p.signature) for p in planned]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(title)
    for i, row in enumerate(rows):
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def variant_tags(p: Planned, sweep: str) -> dict[str, str]:
    tags = {"ablate.sweep": sweep, "ablate.variant": p.variant.name, "ablate.axis": p.variant.axis,
            "ablate.choice": p.variant.choice, "ablate.signature": p.signature, "ablate.lineage": p.lineage}
    untestable = p.cfg.get("untestable") or {}
    if p.variant.axis in untestable and not p.cfg.generator.simulated:  # no verdict in the report, and why
        tags["ablate.untestable"] = str(untestable[p.variant.axis])
    return tags


def job_config(cfg: DictConfig) -> dict:
    """The resolved config a job gets: a plain dict, with local paths made absolute (jobs may start elsewhere)."""
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config["paths"] = {key: str(Path(value).resolve()) for key, value in config["paths"].items()}
    return config


def run_single(cfg: DictConfig, overrides: Sequence[str]) -> int:
    """`python -m ablate`: the composed config once, here, in the foreground, with a progress bar.

    The same run already FINISHED: nothing to do. Left unfinished with a checkpoint (killed, crashed): resumed.
    """
    (p,) = plan(cfg, overrides)
    found = check_before_submit([p], cfg, cluster="local", dry_run=False)  # before any run is created
    print_found(found)
    found.raise_refusal()
    uri = tracking.check_reachable(cfg.tracking.uri, cfg.tracking.timeout_s)
    client = tracking.client(uri)
    exp_id = tracking.experiment_id(client, cfg.tracking.experiment)
    runs = [] if cfg.sweep.force else tracking.find_runs(client, exp_id, signature=p.signature, role="variant")
    kind, run_id = _decide(runs, {}, _has_checkpoint(cfg))
    if kind == "finished":
        print(f"{p.variant.name} ({p.signature}) already FINISHED as MLflow run {run_id} in experiment "
              f"'{cfg.tracking.experiment}'; nothing to do (sweep.force=true runs it again).")
        return 0
    if kind == "resume":
        print(f"{p.variant.name}: resuming MLflow run {run_id} from its checkpoint")
    else:
        run_id = tracking.create_variant_run(client, exp_id, p.variant.name, variant_tags(p, "none"))
        print(f"{p.variant.name}: MLflow run {run_id} in experiment '{cfg.tracking.experiment}' at {uri}")
    from ablate import processes
    from ablate.trainer import train

    config = OmegaConf.create(job_config(p.cfg))
    state = processes.launch(config, train, config, run_id, uri, progress=StepBar(p.variant.name),
                             log=processes.launch_log(config, run_id))
    if state.diverged:
        print(f"diverged at step {state.step + 1}: the run is marked ablate.diverged=true and FAILED")
        return 1
    print(f"done: {state.step} steps, {hours(state.gpu_hours)} GPU-hours" + (f" ({state.stopped})" if state.stopped
                                                                           else ""))
    return 0


def check_sweep(cfg: DictConfig) -> None:
    """The sweep's own settings, which no variant changes: one line naming the setting at fault."""
    check_spread(cfg.sweep)
    check_question(cfg.sweep)
    if seeding.seeded(cfg.sweep):  # the adaptive sweep with seeds: looks at whole seeds, about the recipes
        if not int(cfg.sweep.looks) >= 1:
            raise ValueError(f"sweep.looks={cfg.sweep.looks}: the adaptive sweep with seeds takes 1 look or more")
        if str(cfg.sweep.level) != "recipes":
            raise ValueError("sweep.adaptive=true with several seeds adds seeds where the verdict about the recipes "
                             f"is open: sweep.level=recipes, not {cfg.sweep.level}")
        from analysis.adaptive import check_rule

        check_rule(float(cfg.sweep.alpha), float(cfg.sweep.futility), None)
    elif cfg.sweep.adaptive:
        check_settings(cfg.sweep, int(cfg.train.steps))


def run_sweep(cfg: DictConfig, overrides: Sequence[str]) -> int:
    """`python -m ablate sweep=loo`: every variant as one job array; with the local cluster, watch and report."""
    check_sweep(cfg)  # the sweep's own settings: before composing its variants (seconds each)
    phases = Phases()
    planned = plan(cfg, overrides)
    phases.done(f"composing and signing {len(planned)} variants")
    sid = sweep_id(cfg, planned)
    if cfg.sweep.extend:  # the seeds the sweep's last report says would settle its open recipe-level verdicts
        last_report = Path(cfg.paths.outputs) / "reports" / sid / "variants.csv"
        counts = seeds_to_settle(last_report)
        if not counts:
            print(f"sweep.extend=true: sweep {sid} has no report yet ({last_report}), so no seeds are added to "
                  "settle its verdicts about the recipes; the same command without sweep.extend makes the report "
                  "once every job has finished")
        else:
            had = Counter(p.variant.name for p in planned)
            planned, more = with_seeds(cfg, overrides, planned, counts)
            said = [f"{name} {had[name]} to {n}" for name, n in more.items()]
            print("sweep.extend=true: the seeds that settle the open verdicts about the recipes (the last report's): "
                  + (", ".join(said) if said else "none: no verdict about the recipes is open at the margin"))
    print_plan(planned, f"sweep {sid}: {len(planned)} variant{'s' if len(planned) > 1 else ''}"
               + (" (dry run: nothing submitted)" if cfg.sweep.dry_run else ""))
    launcher = OmegaConf.to_container(cfg.launcher, resolve=True, enum_to_str=True)
    requested = str(launcher["cluster"])  # a dry run of launcher=slurm may be made where SLURM is not
    cluster = requested if cfg.sweep.dry_run and requested != "auto" else resolve_cluster(requested)
    found = check_before_submit(planned, cfg, cluster=cluster, dry_run=bool(cfg.sweep.dry_run))
    print_found(found)  # before any run is created: what the jobs will import, load and hold
    found.raise_refusal()
    phases.done("the pre-flight checks")
    launcher["signal_delay_s"] = found.signal_delay_s
    if cfg.sweep.dry_run:
        if len(planned) > 1:  # the designs compare variants: none for one run
            print_designs(cfg, planned)
        if seeding.seeded(cfg.sweep):
            print(seeding.describe(seeded_design(cfg, planned), Counter(p.variant.name for p in planned),
                                   planned[0].variant.name))
        return 0
    uri = tracking.check_reachable(cfg.tracking.uri, cfg.tracking.timeout_s)  # before any job starts
    client = tracking.client(uri)
    exp_id = tracking.experiment_id(client, cfg.tracking.experiment)
    parent = tracking.sweep_parent(client, exp_id, sid, {"ablate.overrides": " ".join(overrides)[:5000],
                                                         SPREAD_TAG: json.dumps(spread_prior(cfg.sweep).__dict__)})
    folder = Path(cfg.launcher.folder).resolve() / sid
    planned = keep_seeds_held(cfg, overrides, planned, seeds_held(client, exp_id, sid))
    design = seeded_design(cfg, planned) if seeding.seeded(cfg.sweep) else None
    if design is not None:  # the seeds its looks plan (the first: those that reach the first look's information)
        planned = _seeded_plan(cfg, overrides, planned, client, parent, design)

    previous = _previous_jobs(folder)

    def runs_of(planned: Sequence[Planned]) -> tuple[dict, dict]:
        kinds, run_ids = {}, {}
        for p in planned:
            runs = [] if cfg.sweep.force else tracking.find_runs(client, exp_id, signature=p.signature,
                                                                 role="variant")
            kind, run_id = _decide(runs, previous, _has_checkpoint(cfg), extend=cfg.sweep.extend)
            if kind == "new" and cfg.sweep.extend:  # a run of this lineage that ran a smaller budget: further
                run_id = _shorter_run(client, exp_id, p, _has_checkpoint(cfg))
                kind = "extend" if run_id else "new"
            if kind == "extend":  # stopped by an adaptive sweep, or a smaller budget: on from its checkpoint
                _reopen(client, run_id, p.signature)
            if kind == "new":
                run_id = tracking.create_variant_run(client, exp_id, p.variant.label, variant_tags(p, sid), parent)
            elif kind == "resume":  # failed, killed, or its job is gone: again, from its checkpoint
                client.update_run(run_id, status="SCHEDULED")
            kinds[p.signature], run_ids[p.variant.label] = kind, run_id
        return kinds, run_ids

    kinds, run_ids = runs_of(planned)
    reported = []
    if design is not None and all(kind == "finished" for kind in kinds.values()):  # every seed in: its next look
        held: dict[str, list[str]] = {}
        for p in planned:
            held.setdefault(p.variant.name, []).append(run_ids[p.variant.label])
        # the look's report, made with the look's boundaries on the runs
        more = seeding.take_look(client, parent, held, planned[0].variant.name, design,
                                 lambda: reported.append(make_report(cfg, uri, sid, list(run_ids.values()))) or
                                 reported[-1].rows)
        if reported and not more:
            print("the adaptive sweep with seeds is done: the report above holds its last look")
        if more:
            planned = plan(cfg, overrides, more)
            kinds, run_ids = runs_of(planned)
    phases.done("MLflow (its database, the sweep's runs)")
    specs, sweep_settings = [], OmegaConf.to_container(cfg.sweep, resolve=True)
    for p in planned:
        kind, run_id = kinds[p.signature], run_ids[p.variant.label]
        meta = {"run_id": run_id}
        if kind == "alive":
            meta["job_id"] = previous[run_id][0]  # the manifest keeps pointing at the job that runs it
        config = job_config(p.cfg)  # composed without the command line's sweep.* (they are not the variant's)
        config["launcher"]["signal_delay_s"] = launcher.get("signal_delay_s")  # as sized: the run's alarm reads it
        config["sweep"] = {**sweep_settings, "runs": run_ids}  # so the adaptive sweep's jobs find each other's runs
        args = (config, run_id, uri) if kind in ("new", "resume", "extend") else ()
        specs.append(JobSpec(p.variant.label, p.signature, args, meta))
    skip_reasons = {"finished": "FINISHED", "alive": "still running (left alone)"}

    from ablate.job import run_variant

    about = {"sweep": sid, "tracking_uri": uri, "experiment": cfg.tracking.experiment, "parent_run_id": parent,
             "metrics": ["val/pass_rate", "compute/gpu_hours"]}
    submission = submit(run_variant, specs, launcher, folder, job_name=f"ablate-{sid}",
                        done=lambda spec: skip_reasons.get(kinds[spec.signature]), about=about, gpus=found.gpus,
                        gpus_per_job=found.per_job)
    new = [it for it in submission.items if not it.skipped_as]
    phases.done(f"submitting {len(new)} ({submission.cluster})")
    finished, alive = (sum(1 for k in kinds.values() if k == kind) for kind in ("finished", "alive"))
    print(f"parent run {parent} in experiment '{cfg.tracking.experiment}' at {uri}")
    print(f"{len(new)} to run, {finished} already FINISHED (skipped)"
          + (f", {alive} still running (left alone)" if alive else "") + f"; jobs in {folder}")
    print(f"harness time: {phases}")
    if submission.cluster == "slurm" or not cfg.launcher.watch:
        for it in new:
            print(f"  {it.spec.name}: job {it.job_id}")
        if not new and not alive and cfg.sweep.report and not reported:  # every job in: its report, as a watched end
            make_report(cfg, uri, sid, [it.spec.meta["run_id"] for it in submission.items])
        if design is not None and new:
            print("the adaptive sweep with seeds: run the same command when these jobs have finished, for its next "
                  "look")
        return 0

    try:
        failed = watch(submission, client)
    except KeyboardInterrupt:
        stopped = interrupt(submission, client, parent)
        print(f"\ninterrupted: {stopped} running jobs cancelled; what they logged is kept in MLflow, and the "
              "same command runs what did not finish", file=sys.stderr)
        return 130
    client.set_terminated(parent, status="FAILED" if failed else "FINISHED")
    workers = len(submission.jobs())
    phases.done(f"the runs ({workers} {submission.cluster} job{'s' * (workers != 1)} side by side)")
    if design is not None and new and not failed:  # the seeds are in: the sweep's next look, and its seeds
        print(f"time: {phases.total:.1f} s: {phases}")
        return run_sweep(cfg, overrides)
    if cfg.sweep.report and not (design is not None and not new and reported):  # a look's report is the last
        make_report(cfg, uri, sid, [it.spec.meta["run_id"] for it in submission.items])
        phases.done("the report")
    print(f"time: {phases.total:.1f} s: {phases}")
    return 1 if failed else 0


class Phases:
    """Where a sweep's wall time goes, phase by phase (from the sweep's start, after Python's imports): what the
    command prints as its harness time and, a watched sweep, at its end."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.seconds = clock, {}
        self.last = self.started = clock()

    def done(self, phase: str) -> None:
        """The time since the last phase ended is `phase`'s."""
        now = self.clock()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    @property
    def total(self) -> float:
        return self.last - self.started

    def __str__(self) -> str:
        return ", ".join(f"{seconds:.1f} s {phase}" for phase, seconds in self.seconds.items())


def seeds_to_settle(variants_csv: Path) -> dict[str, int]:
    """From a sweep's report (variants.csv): each variant whose recipe-level verdict is open, with the seeds it then
    has plus the more it needs (more_seeds_variant); the base recipe with its seeds plus the most any verdict asks of
    it (its seeds serve every variant); every other variant with the seeds it has (a re-sweep keeps them in the
    sweep and its report). Empty without a report."""
    import csv

    from ablate.sweeps import RECIPE_VARIANT

    if not variants_csv.exists():
        return {}
    rows = list(csv.DictReader(variants_csv.open()))
    counts = {r["variant"]: int(r["n_seeds"] or 1) + int(r.get("more_seeds_variant") or 0) for r in rows}
    base = max((int(r["more_seeds_base"]) for r in rows if r.get("more_seeds_base")), default=0)
    counts[RECIPE_VARIANT] = counts.get(RECIPE_VARIANT, 1) + base
    return counts


def seeds_held(client, exp_id: str, sid: str) -> dict[str, int]:
    """The seeds each variant of sweep `sid` has in MLflow: its runs' distinct signatures (each seed signs apart; a
    forced re-run of one has its signature)."""
    signatures: dict[str, set] = {}
    for run in tracking.find_runs(client, exp_id, sweep=sid, role="variant"):
        tags = run.data.tags
        signatures.setdefault(tags.get("ablate.variant", ""), set()).add(tags.get("ablate.signature"))
    return {name: len(held) for name, held in signatures.items() if name}


def with_seeds(cfg: DictConfig, overrides: Sequence[str], planned: list[Planned],
               counts: dict[str, int]) -> tuple[list[Planned], dict[str, int]]:
    """The plan with each of its variants' seeds raised to `counts` where it has fewer (replanned only then), and
    the variants raised (name -> their seeds now)."""
    had = Counter(p.variant.name for p in planned)
    more = {name: n for name, n in counts.items() if name in had and n > had[name]}
    return (plan(cfg, overrides, {**had, **more}) if more else planned), more


def keep_seeds_held(cfg: DictConfig, overrides: Sequence[str], planned: list[Planned],
                    held: dict[str, int]) -> list[Planned]:
    """The plan with every seed the sweep already holds (`held`, seeds_held) where it asks for fewer: a re-sweep
    without sweep.extend of a sweep extended before keeps its seeds, in its jobs (those FINISHED skipped, the others
    resumed) and in its report, instead of dropping them from both."""
    planned, more = with_seeds(cfg, overrides, planned, held)
    if more:
        print("the sweep holds more seeds than sweep.seeds (sweep.base_seeds) asks: kept, "
              + ", ".join(f"{name} {n}" for name, n in more.items()))
    return planned


def seeded_design(cfg: DictConfig, planned: Sequence[Planned]) -> seeding.Design:
    """What the adaptive sweep with seeds measures its looks against: the cheapest fixed full-length design that
    answers the sweep's question (analysis.design.cheapest, as the dry run prints it), its information on a change
    of A, a seed's variance (its fit's sd, run_sds, and the spread's prior), a seed's GPU-hours (run_gpu_hours)."""
    from analysis.design import MAX_SEEDS, cheapest, run_sds

    q = question_of(cfg)
    variants, hours, kw = _sides(planned)
    found = cheapest(q, hours=hours, lengths=(1.0,), **kw)
    if not found:
        raise ValueError(f"sweep.adaptive=true with seeds: no fixed design of up to {MAX_SEEDS} seeds a variant "
                         f"reaches {q.power:.0%} power at |dA| >= {q.margin_A:g} about the recipes, so its looks "
                         "have nothing to spend against: raise sweep.margin_A")
    fixed = found[0].design
    var = run_sds(1.0, **kw)[0] ** 2 + q.spread_A**2
    return seeding.Design(i_max=1 / (var * (1 / fixed.seeds + 1 / fixed.base_seeds)), var=var,
                          hours=(hours[0] / max(variants, 1), hours[1]),
                          looks=int(cfg.sweep.looks), alpha=float(cfg.sweep.alpha),
                          futility=float(cfg.sweep.futility), budget=q.budget,
                          fixed=(fixed.seeds, fixed.base_seeds))


def _seeded_plan(cfg: DictConfig, overrides: Sequence[str], planned: list[Planned], client, parent: str,
                 design: seeding.Design) -> list[Planned]:
    """The plan with the seeds the sweep's looks planned (the first time: those the first look needs)."""
    counts = seeding.planned_counts(client.get_run(parent).data.tags)
    if not counts:
        counts = seeding.first_plan(Counter(p.variant.name for p in planned), planned[0].variant.name, design)
        client.set_tag(parent, seeding.PLAN_TAG, json.dumps(counts))
    planned, more = with_seeds(cfg, overrides, planned, counts)
    if more:
        print("the adaptive sweep with seeds plans " + ", ".join(f"{name} {n}" for name, n in
                                                                Counter(p.variant.name for p in planned).items())
              + " seeds")
    return planned


def spread_prior(sweep: DictConfig) -> Spread:
    """The prior of the spread between runs of one recipe this sweep's report uses (sweep.run_sd_*)."""
    return Spread(sd_A=float(sweep.run_sd_A), sd_B=float(sweep.run_sd_B), prior_dof=float(sweep.run_sd_dof))


def check_spread(sweep: DictConfig) -> None:
    for key in ("run_sd_A", "run_sd_B", "run_sd_dof"):
        if not float(sweep[key]) >= 0:
            raise ValueError(f"sweep.{key}={sweep[key]}: must be 0 or more")


def validation_of(cfg: DictConfig) -> tuple[int, int, int]:
    """A run's validation as the designs price it: its points (at least 5), prompts and answers a prompt (the mock
    generator's own, else the task's)."""
    points = max(int(cfg.train.steps) // max(int(cfg.train.val_every), 1), 5)
    gen = cfg.generator
    if "val_prompts" in gen:
        return points, int(gen.val_prompts), int(gen.val_samples)
    return points, int(cfg.task.n_val_prompts), int(cfg.task.val_samples)


LEVELS = ("runs", "recipes")


def check_question(sweep: DictConfig) -> None:
    """sweep.margin_B, sweep.level, sweep.budget_gpu_hours (margin_A: ablate/rungs.py's check): one line each."""
    if str(sweep.get("level", "recipes")) not in LEVELS:
        raise ValueError(f"sweep.level={sweep.level}: runs or recipes (the verdicts about these runs, or the recipes)")
    margin_B = sweep.get("margin_B")
    if margin_B is not None and not float(margin_B) > 0:
        raise ValueError(f"sweep.margin_B={margin_B}: the smallest move of B that matters, above 0, or null")
    budget = sweep.get("budget_gpu_hours")
    if budget is not None and not float(budget) > 0:
        raise ValueError(f"sweep.budget_gpu_hours={budget}: GPU-hours above 0, or null (no budget)")


def run_gpu_hours(p: Planned) -> float:
    """One run's GPU-hours at its full budget: the mock's own (generator.gpu_hours), else the cost model's
    (cost.priced: the pre-flight's figure) at the run's layout."""
    from ablate import checks, cost

    if "gpu_hours" in p.cfg.generator and p.cfg.generator.get("simulated", False):
        return float(p.cfg.generator.gpu_hours)
    return cost.priced(p.cfg, checks.model_shape(p.cfg.model).params).gpu_hours


def _sides(planned: Sequence[Planned]) -> tuple[int, tuple[float, float], dict]:
    """How the designs price a sweep: its variants other than the base (the first), the GPU-hours of a seed of all
    of them together and of the base (run_gpu_hours), and the base's validation (validation_of) as analysis.design
    takes it."""
    first = planned[0].variant.name
    variants = [p for p in planned if p.variant.name != first and not p.variant.replica]
    points, prompts, samples = validation_of(planned[0].cfg)
    return (len(variants), (sum(run_gpu_hours(p) for p in variants), run_gpu_hours(planned[0])),
            dict(points=points, val_prompts=prompts, val_samples=samples))


def question_of(cfg: DictConfig):
    """The sweep's stated question (analysis.design.Question) from sweep.margin_A (unset: the paper's 0.02),
    margin_B, level, budget_gpu_hours and the prior spread (sweep.run_sd_A, run_sd_B)."""
    from analysis.design import Question

    sweep = cfg.sweep
    margin_A = sweep.get("margin_A")
    return Question(margin_A=float(margin_A) if margin_A is not None else MARGIN_A,
                    margin_B=float(sweep.margin_B) if sweep.get("margin_B") is not None else None,
                    level=str(sweep.get("level", "recipes")),
                    budget=float(sweep.budget_gpu_hours) if sweep.get("budget_gpu_hours") is not None else None,
                    spread_A=float(sweep.run_sd_A), spread_B=float(sweep.run_sd_B))


def print_designs(cfg: DictConfig, planned: Sequence[Planned]) -> None:
    """The designs and what each answers of the sweep's question (analysis.design's answer and cheapest), one row a
    design: seeds a variant, seeds of the base, each run's length, the resolution on A between these runs and between
    the recipes, the power at the margins at the level asked, the false-claim rate, GPU-hours at the preset's layout
    (run_gpu_hours). This sweep and the standard designs first, then the cheapest reaching the power at each run
    length; the cheapest within the budget marked, or a plain line that none is and what budget would do."""
    from analysis.design import DESIGNS, MAX_SEEDS, Design, answer, cheapest, run_sds

    q = question_of(cfg)
    variants, hours, kw = _sides(planned)
    points, prompts, samples = kw["points"], kw["val_prompts"], kw["val_samples"]
    this = Design("this sweep", int(cfg.sweep.seeds), int(cfg.sweep.base_seeds))
    fixed = [answer(d, q, sds=run_sds(d.fraction, **kw), hours=hours) for d in (this, *DESIGNS)]
    found = cheapest(q, hours=hours, **kw)
    within = [a for a in found if q.budget is None or a.gpu_hours <= q.budget]
    b_said = (f", |dB| >= {q.margin_B:g}" if q.margin_B else "")
    print(f"the question: |dA| >= {q.margin_A:g}{b_said} about the {q.level}, found {q.power:.0%} of the time"
          + (f", within {_hours(q.budget)} GPU-hours" if q.budget else "") + f" (sweep.margin_A, margin_B, level, "
          f"budget_gpu_hours; a spread of A between runs of {q.spread_A:.3f}; {variants} variants at "
          f"{_hours(hours[0])} GPU-hours a seed, the base {_hours(hours[1])}; {points} validation points of "
          f"{prompts} x {samples} answers: docs/fitting.md#a-stated-question)")
    print("  resolved: the move of A found 9 times in 10, between these runs and between the recipes")
    if q.margin_B and q.level == "recipes" and not q.spread_B:
        print("  B: no claim about the recipes' B (no spread of B between runs is known: sweep.run_sd_B); the "
              "designs are chosen on A")
    rows = [("design", "seeds a variant", "base seeds", "run length", "resolved: runs", "recipes", "power A",
             "power B", "false claims", "GPU-hours", "")]
    mark = within[0] if within else None
    for a in (*fixed, *found):
        d = a.design
        resolved = [f"{r:.3f}" if a.identified else "-" for r in a.resolution]
        rows.append((d.name, str(d.seeds), str(d.base_seeds), f"{d.fraction:g} of the budget", *resolved,
                     f"{a.power_A:.2f}", "-" if a.power_B != a.power_B else f"{a.power_B:.2f}",
                     f"{a.false_claims:.3f}", _hours(a.gpu_hours),
                     "<- the cheapest at " + f"{q.power:.0%}" + (" within the budget" if q.budget else "")
                     if a is mark else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.rjust(w) if 0 < i < len(r) - 1 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    if not found:
        print(f"  no design of up to {MAX_SEEDS} seeds a variant reaches {q.power:.0%} power at these margins "
              f"about the {q.level}")
    elif not within:
        print(f"  none reaches {q.power:.0%} power within {_hours(q.budget)} GPU-hours: the cheapest that does needs "
              f"{_hours(found[0].gpu_hours)} ({found[0].design.name}, each {found[0].design.fraction:g} of the budget)")


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def interrupt(submission: Submission, client, parent: str, wait_s: float = 15.0) -> int:
    """Ctrl-C during a local sweep: cancel its jobs (SIGINT: each trainer flushes its metrics and marks its run
    KILLED), wait for them to end, and delete the runs that never started (empty: a later sweep makes its own).
    Returns how many jobs were still running."""
    alive = sum(not job.done() for job in submission.jobs())
    submission.cancel()
    deadline = time.monotonic() + wait_s
    while not submission.finished() and time.monotonic() < deadline:
        time.sleep(0.2)
    submission.cancel(signal.SIGKILL)  # what has not ended by now will not end by itself
    for it in submission.todo:
        if client.get_run(it.spec.meta["run_id"]).info.status == "SCHEDULED":
            client.delete_run(it.spec.meta["run_id"])
    client.set_terminated(parent, status="KILLED")
    return alive


def _decide(runs: list, previous: dict[str, tuple[str, str]], has_checkpoint: Callable[[str], bool],
            extend: bool = False) -> tuple[str, Optional[str]]:
    """What to do with a variant, given its runs (newest first) and the sweep's earlier jobs (run id -> job id,
    state): ("finished", run) skip it; ("alive", run) leave its live job alone; ("resume", run) run it again into
    the same run, from its checkpoint; ("extend", run) the same for a run an adaptive sweep stopped (with `extend`);
    ("new", None) a fresh run (an unfinished run without a checkpoint is not continued: its steps would be logged
    twice)."""
    done = next((r for r in runs if r.info.status == "FINISHED"), None)
    if done is not None:
        if extend and SETTLED_TAG in done.data.tags and has_checkpoint(done.info.run_id):
            return "extend", done.info.run_id
        return "finished", done.info.run_id
    unfinished = [r.info.run_id for r in runs if r.info.status != "FINISHED"]
    if unfinished and previous.get(unfinished[0], ("", ""))[1] in ALIVE:
        return "alive", unfinished[0]
    resumable = next((run_id for run_id in unfinished if has_checkpoint(run_id)), None)
    return ("resume", resumable) if resumable else ("new", None)


def _shorter_run(client, exp_id: str, p: Planned, has_checkpoint: Callable[[str], bool]) -> Optional[str]:
    """The newest FINISHED run of p's lineage that ran fewer steps than p asks for and kept its checkpoint (a
    settled one, or one run with sweep.keep_checkpoints=true), or None."""
    for run in tracking.find_runs(client, exp_id, lineage=p.lineage, role="variant"):
        steps = run.data.params.get("train.steps", "")
        if run.info.status == "FINISHED" and steps.isdigit() and int(steps) < int(p.cfg.train.steps) \
                and has_checkpoint(run.info.run_id):
            return run.info.run_id
    return None


def _reopen(client, run_id: str, signature: str) -> None:
    """A finished run made ready to go on: no longer settled (the report then waits for its full budget), the step
    it goes on from kept as `ablate.extended_from`, the signature of its new budget (a re-run then finds it),
    SCHEDULED. Its params stay those it started with (MLflow keeps them once)."""
    run = client.get_run(run_id)
    start = run.data.tags.get(SETTLED_TAG) or run.data.params.get("train.steps", "")
    client.set_tag(run_id, EXTENDED_TAG, start)
    client.set_tag(run_id, "ablate.signature", signature)
    for key in (SETTLED_TAG, END_REASON_TAG):
        if key in run.data.tags:
            client.delete_tag(run_id, key)
    client.update_run(run_id, status="SCHEDULED")


def _has_checkpoint(cfg: DictConfig) -> Callable[[str], bool]:
    runs = Path(cfg.paths.runs)
    return lambda run_id: (runs / run_id / "checkpoint.pt").exists()


def _previous_jobs(folder: Path) -> dict[str, tuple[str, str]]:
    """From an earlier submission of this sweep: run id -> (job id, its scheduler state now)."""
    path = folder / "manifest.json"
    if not path.exists():
        return {}
    manifest = json.loads(path.read_text())
    states = job_states(manifest)
    return {row["run_id"]: (row["job_id"], states.get(row["job_id"], "")) for row in manifest["jobs"]
            if row.get("job_id") and row.get("run_id")}


def watch(submission: Submission, client) -> list[str]:
    """Show each variant's progress until every job ends. Returns the names of the variants that failed."""
    display = SweepDisplay(client, submission)
    while not submission.finished():
        display.update()
        time.sleep(0.5)
    failed: list[str] = []
    for it in submission.todo:
        error = submission.error(it)
        if error:  # its one line (the traceback's last) first; the traceback in the job's log
            failed.append(it.spec.name)
            lines = [line for line in error.strip().splitlines() if line.strip()] or ["?"]
            log = getattr(getattr(it.job, "paths", None), "stderr", None)
            print(f"\n{it.spec.name} failed (job {it.job_id}): {lines[-1].strip()}"
                  + (f"\n  its traceback: {log}" if log else f"\n{error}"), file=sys.stderr)
    display.update(final=True)
    return failed


def make_report(cfg: DictConfig, uri: str, sid: str, run_ids: Sequence[str]):
    from analysis import make_report as report

    out = Path(cfg.paths.outputs) / "reports" / sid
    margin = cfg.sweep.get("margin_A")
    result = report(cfg.tracking.experiment, tracking_uri=uri, out_dir=out, sweep=sid, run_ids=list(run_ids),
                    spread=spread_prior(cfg.sweep), margin_A=float(margin) if margin is not None else MARGIN_A)
    print(result.table_md)
    print(f"report: {result.html.resolve()}")
    if result.artifact_error:
        print(f"warning: {result.artifact_error}", file=sys.stderr)
    return result
