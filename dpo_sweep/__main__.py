from dpo_sweep.cli import entry

if __name__ == "__main__":  # not when multiprocessing's spawn re-imports the main module
    entry()
