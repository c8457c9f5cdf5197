"""The planner's pure core: a memory model of one trial and the rules that order, prune and
dedupe the configurations of a sweep. Ray-free: ``dpo-sweep run`` drives it through a Tune
``Searcher`` (:mod:`dpo_sweep.sweep.planner`), ``dpo-sweep validate`` prints its predictions."""
