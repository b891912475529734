"""The documented path of ``python -m bench_cli.profile.overhead``; the profiler is bench_cli/commands/profile/."""
