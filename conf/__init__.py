"""Hydra configuration tree of attnbench (package data, so `pkg://conf` finds it when installed)."""
