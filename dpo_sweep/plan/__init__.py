"""The planner's pure core: a memory model of one trial and the rules that order, prune and
dedupe the configurations of a sweep (issue 15). Ray-free; not yet wired into ``dpo-sweep run``."""
