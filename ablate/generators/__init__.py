"""Generators: produce rollouts (tokens, generator log-probs, policy versions, rewards) and validation pass rates."""
