"""The RL core: each axis option as a small function or class that the config names (`_target_`)."""
