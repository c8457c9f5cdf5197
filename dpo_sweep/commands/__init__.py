"""The bodies of the ``dpo-sweep`` commands, one module each: validate.py, run.py, trial.py,
report.py (``report``, ``recommend`` and :func:`~dpo_sweep.commands.report.analyse_dir`),
compare.py. The top layer: a command may import any part of the package, and nothing in the
package imports a command but ``cli.py``, which parses the arguments and picks the command."""
