"""A process tracer for the sweep's start-up: ``sitecustomize.py`` logs, ``merge.py`` reads."""
