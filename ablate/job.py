"""What a launched job runs: one variant, from its resolved config, into its MLflow run. Picklable by reference."""

from __future__ import annotations

from omegaconf import OmegaConf


def run_variant(config: dict, run_id: str, tracking_uri: str) -> dict:
    """Train the variant described by `config` (a resolved config as a plain dict, paths absolute) and return its
    final state. A job started again for the same run resumes it from its checkpoint."""
    from ablate.trainer import train

    state = train(OmegaConf.create(config), run_id, tracking_uri)
    return {"run_id": run_id, "step": state.step, "gpu_hours": state.gpu_hours, "diverged": state.diverged}
