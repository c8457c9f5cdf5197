import sys
from pathlib import Path

# The hand-made results live next to the analysis tests; share them rather than copy them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
