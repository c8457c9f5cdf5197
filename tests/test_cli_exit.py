"""The ``dpo-sweep`` command's exit (dpo_sweep/cli.py: entry): the process ends without the
interpreter's module teardown, but only after what an exit must do."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_command_exits_with_mains_code_after_threads_atexit_and_flushed_output(tmp_path):
    # A stand-in main that leaves a non-daemon thread writing a file, an atexit handler and
    # unflushed output: all three must have happened when the process is gone.
    marker = tmp_path / "thread.txt"
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from dpo_sweep import cli
        def main():
            def late():
                time.sleep(0.3)
                open({str(marker)!r}, "w").write("done")
            threading.Thread(target=late).start()
            atexit.register(lambda: print("atexit ran", flush=True))
            sys.stdout.write("unflushed line\\n")
            return 3
        cli.main = main
        cli.entry()
        print("never printed")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["unflushed line", "atexit ran"]
    assert marker.read_text() == "done"


def test_python_m_dpo_sweep_goes_through_the_same_exit(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dpo_sweep", "validate", str(tmp_path / "missing.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "missing.yaml" in done.stderr
