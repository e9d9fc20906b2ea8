"""`python -m ablate [overrides]`: one run in the foreground; `python -m ablate sweep=loo`: a sweep as a job array.

`--cfg job` prints the resolved config; `sweep.dry_run=true` (the dry run) prints the variants and submits nothing;
`--help` is ours, short (the everyday commands, the groups a user chooses), and `--hydra-help` Hydra's whole help.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ablate import schema
from ablate.config import DEMO, check_overrides, file_study
from ablate.tracking import TrackingUnavailable

schema.register()


@hydra.main(config_path="pkg://ablate.conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> int:
    from ablate.run import run_single, run_sweep

    overrides = list(HydraConfig.get().overrides.task)
    try:
        choices = dict(HydraConfig.get().runtime.choices)
        check_overrides(cfg, overrides, choices)  # a key nothing reads: refused
        study = file_study(cfg, overrides, choices)
        if study:
            print(f"study '{study}' (MLflow experiment '{cfg.tracking.experiment}', {cfg.paths.outputs}/): a model or "
                  f"data of your own, filed apart from the demo's '{DEMO}'; name=... chooses another")
        # one run (sweep=none) here, in the foreground; but as a job of its own where the launcher is SLURM's, and
        # only planned, as a sweep's dry run is, with sweep.dry_run=true
        here = cfg.sweep.name == "none" and cfg.launcher.cluster != "slurm" and not cfg.sweep.dry_run
        code = run_single(cfg, overrides) if here else run_sweep(cfg, overrides)
    except (TrackingUnavailable, ValueError, RuntimeError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    if code:
        sys.exit(code)
    return code


# `--help`: what a user types every day and the groups they choose (the first option of each is the default); the
# design axes and the internal schema/* groups are Hydra's whole help's (`--hydra-help`)
EVERYDAY = """\
usage: python -m ablate [GROUP=OPTION] [KEY=VALUE] ...   (Hydra overrides: the config is conf/config.yaml's tree)

Leave-one-out ablations of the ScaleRL recipe: which axes move the ceiling A, which only the speed B.

everyday commands:
  python -m ablate                               ScaleRL once, here, with a progress bar (the tiny demo, on a CPU)
  python -m ablate loss=dapo seed=3              any axis, any value
  python -m ablate sweep=loo                     ScaleRL + one variant per reverted axis, as one job array, then
                                                 its report (outputs/<name>/reports/)
  python -m ablate sweep=loo sweep.dry_run=true  the dry run: the variants and the pre-flight; submits nothing
  python -m ablate sweep=loo generator=mock      the mock run: a simulator with a known truth, ~30 s
  python -m ablate --cfg job                     the resolved config, and nothing else
  python -m analysis report --experiment NAME    fit, rank and report a study's runs
  python -m launch status                        the jobs of the last sweep

groups you choose (GROUP=OPTION; the first option is the default):
{groups}
the design axes (docs/axes.md; a recipe chooses an option of each, the command line any other):
{axes}

keys: KEY=VALUE sets a key the config has (train.steps=100, name=my-study); +KEY=VALUE adds one only to a dict of
your own keys (+model.overrides.max_position_embeddings=32768, +task.chat_kwargs.enable_thinking=false)

  --hydra-help   Hydra's whole help: every group (the internal schema/* ones too), the config, Hydra's own flags
docs: README.md; docs/first-run.md (your model and data); docs/index.md (the rest)
"""
CHOSEN = {"experiment": "the study's preset", "model": "model.path=DIR or a hub id with hf",
          "task": "task.data_path=FILE with math", "generator": "vllm on GPUs; mock: the mock run", "sweep": "",
          "recipe": "", "launcher": "", "run": "trainer ranks, generator engines"}
AXES = ("loss", "aggregation", "normalization", "precision", "length_control", "off_policy", "filtering")


def short_help() -> str:
    """EVERYDAY with the options of each group read from the config tree (its defaults first)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    conf = files("ablate.conf")
    defaults = {}
    for entry in OmegaConf.to_container(OmegaConf.create(conf.joinpath("config.yaml").read_text()))["defaults"]:
        if isinstance(entry, dict):
            defaults.update({key: value for key, value in entry.items() if isinstance(value, str)})

    def options(group: str) -> str:
        names = sorted(p.name[:-5] for p in conf.joinpath(group).iterdir() if p.name.endswith(".yaml"))
        first = [defaults[group]] if defaults.get(group) in names else []
        return " | ".join(first + [n for n in names if n not in first])

    rows = [f"  {group:<16}{options(group)}" + (f"   ({what})" if what else "") for group, what in CHOSEN.items()]
    return EVERYDAY.format(groups="\n".join(rows), axes="\n".join(f"  {axis:<16}{options(axis)}" for axis in AXES))


def main() -> None:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(short_help(), end="")
        return
    if "--hydra-help" in sys.argv[1:]:  # Hydra's application help (groups, config), then its own flags
        argv = list(sys.argv)
        for flag in ("--help", "--hydra-help"):
            sys.argv = [arg if arg != "--hydra-help" else flag for arg in argv]
            try:
                app()
            except SystemExit as exit:
                if exit.code:
                    raise
            finally:
                sys.argv = argv
        return
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C outside a sweep's watch (which says more): one line, not a traceback
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
