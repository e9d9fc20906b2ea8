"""torch.distributed for ablate: the trainer layouts (layouts.py), the process groups of one process as an object
(groups.py), rank 0 leading the other trainer ranks (leader.py), where the job's processes are (topology.py) and
SLURM's warning in them (signals.py). The processes themselves are started by ablate/processes.py. Why:
docs/design.md#trainer-ranks."""
