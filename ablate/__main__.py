"""`python -m ablate [overrides]`: one run in the foreground; `python -m ablate sweep=loo`: a sweep as a job array.

`--cfg job` prints the resolved config; `sweep.dry_run=true` prints the variants and submits nothing.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ablate import schema
from ablate.tracking import TrackingUnavailable

schema.register()


@hydra.main(config_path="pkg://ablate.conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> int:
    from ablate.run import run_single, run_sweep

    overrides = list(HydraConfig.get().overrides.task)
    try:
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C outside a sweep's watch (which says more): one line, not a traceback
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
