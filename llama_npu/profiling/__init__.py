"""The `profile` command's measured matrix of strategy combinations (strategy_profile.py): it
runs `train` in child processes and reads their metrics, so it imports nothing of training/ and
sits above memory/ (the planner it compares with) and below commands/."""
