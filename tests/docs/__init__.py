"""The docs and the structure they describe: every example runs, no diary, layers import
downwards."""
