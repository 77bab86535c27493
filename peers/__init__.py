"""Peer implementations timed side by side with the playground's kernels (not part of any ladder)."""
