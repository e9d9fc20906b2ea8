"""What a launched job runs: one variant, from its resolved config, into its MLflow run. Picklable by reference."""

from __future__ import annotations

from omegaconf import OmegaConf


def run_variant(config: dict, run_id: str, tracking_uri: str) -> dict:
    """Train the variant described by `config` (a resolved config as a plain dict, paths absolute) and return its
    final state. A job started again for the same run resumes it from its checkpoint."""
    from ablate import processes
    from ablate.trainer import train

    cfg = OmegaConf.create(config)
    state = processes.launch(cfg, train, cfg, run_id, tracking_uri,  # the layout's processes; one by default
                             log=processes.launch_log(cfg, run_id))
    if state is None:  # a node of a job of several, without rank 0: the run's result is node 0's
        return {"run_id": run_id}
    return {"run_id": run_id, "step": state.step, "gpu_hours": state.gpu_hours, "diverged": state.diverged}
