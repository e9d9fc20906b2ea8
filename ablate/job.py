"""What a launched job runs: one variant, from its resolved config, into its MLflow run. Picklable by reference."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf


def run_variant(config: dict, run_id: str, tracking_uri: str, spill_dir: Optional[str] = None) -> dict:
    """Train the variant described by `config` (a resolved config as a plain dict) and return its final state."""
    from ablate.trainer import train

    cfg = OmegaConf.create(config)
    state = train(cfg, run_id, tracking_uri, spill_dir=Path(spill_dir) if spill_dir else None)
    return {"run_id": run_id, "step": state.step, "gpu_hours": state.gpu_hours}
