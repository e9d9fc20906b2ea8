"""Tasks: prompts, reference answers and the reward. `conf/task/<name>.yaml` names one with `_target_`."""
