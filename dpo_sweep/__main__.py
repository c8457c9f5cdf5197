from dpo_sweep.cli import entry

entry()
