"""The neutral core: pure facts and maths that the planner, the trainer and the analyser all use
(a data set's lengths and the micro-batches' order, where and how a trial runs, the checkpoint
levels, a row's status and time source, FLOPs, memory budgets, throughput noise, stability). It
imports no other layer of the package (tests/test_layering.py), so each of them can import it."""
