"""What a model is, read from its config and its modules, for the trainer and the planner alike:
presets.py (public shapes by name), pretrained.py (a checkpoint folder's config and tokenizer, no
weights), family.py (a family's layers, attention, MLP, experts, projections; its checkpoint
regions, LoRA targets and lean ops; the meta-device build). Imports no other layer but config and core."""
