"""dpo-sweep: measure the memory / time / stability frontier of DPO training settings."""

__version__ = "0.1.0"
