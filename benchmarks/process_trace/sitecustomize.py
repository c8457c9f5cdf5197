"""Where a sweep's start-up goes, process by process: with this folder first on PYTHONPATH and
DPO_TRACE_DIR set, every Python process that starts (the command, its preflight's process, Ray's
processes, the warm workers, the Tune trial processes) appends ``<time> <pid> <thread> <event>``
lines to DPO_TRACE_DIR/<pid>.log: the start of the process, the imports in MODS and the calls of
the functions in FUNCS, each with its duration. ``merge.py DIR`` makes one timeline of them.

    python benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml --out OUT --trace

does it for one sweep (``OUT/<name>_trace.csv`` and a table of the start-up's milestones); by hand:

    DPO_TRACE_DIR=/tmp/trace PYTHONPATH=benchmarks/process_trace:$PYTHONPATH dpo-sweep run SPACE
    python benchmarks/process_trace/merge.py /tmp/trace --csv trace.csv

Without DPO_TRACE_DIR it does nothing but hand over to the next sitecustomize on the path. A
function named in FUNCS that a version of the code lacks is logged as ``! no <name>``."""
import os, sys, time, threading
_DIR = os.environ.get("DPO_TRACE_DIR")
if _DIR:
    import functools, importlib.abc
    _f = None
    def mark(what):
        global _f
        if _f is None:
            os.makedirs(_DIR, exist_ok=True)
            _f = open(os.path.join(_DIR, f"{os.getpid()}.log"), "a", buffering=1)
        _f.write(f"{time.time():.3f} {os.getpid()} {threading.current_thread().name.replace(' ', '_')} {what}\n")
    mark("start " + " ".join(sys.argv)[:160])
    FUNCS = {
        "ray._private.worker": ["init", "shutdown"],
        "ray._private.node": ["Node.start_head_processes", "Node.start_ray_processes"],
        "dpo_sweep.space": ["load"],
        "dpo_sweep.preflight": ["check_files", "check_inputs"],
        "dpo_sweep.sweep.startup": ["check_inputs", "model_shapes"],
        "dpo_sweep.commands.run": ["_prepare", "_analyse", "_run", "import_tune"],
        "dpo_sweep.sweep.ray_cluster": ["connect_ray"],
        "dpo_sweep.sweep.tuner": ["run_sweep"],
        "dpo_sweep.sweep.slots": ["start_warm_workers"],
        "dpo_sweep.sweep.output_dir": ["prepare_output", "save_environment"],
        "dpo_sweep.sweep.warm_worker": ["TrialWorker.__init__", "run_in_warm_worker", "start_pool"],
        "dpo_sweep.sweep.trainable": ["tune_trainable"],
        "dpo_sweep.sweep.trial_run": ["run_and_report", "_worker_environment"],
        "dpo_sweep.train.loop": ["run_trial", "summarise", "train_step"],
        "dpo_sweep.train.setup": ["load_data", "build_trial", "configure_device_memory", "precompute_reference"],
        "dpo_sweep.train.warm_state": ["WarmState.release"],
        "dpo_sweep.train.evaluation": ["held_batch_loss"],
        "dpo_sweep.train.model": ["prepare_imports", "build_model"],
        "dpo_sweep.telemetry.environment": ["environment_info"],
        "dpo_sweep.plan.memory": ["built_shape"],
    }
    MODS = {"torch", "transformers", "transformers.modeling_utils", "sklearn", "torch._dynamo",
            "torch.distributed.tensor", "liger_kernel.transformers", "ray.tune", "pandas", "pydantic",
            "ray", "dpo_sweep.train.loop", "dpo_sweep.commands.run", "plotly", "ray.train"}
    def _wrap(owner, attr, label):
        fn = getattr(owner, attr)
        @functools.wraps(fn)
        def w(*a, **k):
            t = time.time(); mark(f"> {label}")
            try:
                return fn(*a, **k)
            finally:
                mark(f"< {label} {time.time() - t:.3f}")
        setattr(owner, attr, w)
    def _patch(module):
        for path in FUNCS.get(module.__name__, ()):
            owner, parts = module, path.split(".")
            try:
                for p in parts[:-1]:
                    owner = getattr(owner, p)
                _wrap(owner, parts[-1], f"{module.__name__}.{path}")
            except AttributeError:
                mark(f"! no {module.__name__}.{path}")
    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in FUNCS and name not in MODS:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            orig = loader.exec_module
            def exec_module(module, _orig=orig, _name=name):
                t = time.time(); mark(f"import> {_name}")
                try:
                    _orig(module)
                finally:
                    mark(f"import< {_name} {time.time() - t:.3f}")
                _patch(module)
            loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Finder())
# Chain to the next sitecustomize on the path, if any.
_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:
    _c = os.path.join(_p, "sitecustomize.py")
    if os.path.abspath(_p or ".") != _here and os.path.isfile(_c):
        exec(compile(open(_c).read(), _c, "exec"), {"__name__": "sitecustomize_chained", "__file__": _c})
        break
