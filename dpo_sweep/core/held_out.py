"""The held-out split's scores (``data.eval_pairs``): their field names, shared by the trainer's
rows, the sweep's collector, the planner's rows and the analysis, and their columns in
results.csv / steps.csv, named as TRL's DPOTrainer logs the same value on its eval split.
Standard library only."""
from __future__ import annotations

#: Field -> column. ``eval_logps/chosen_drift`` (policy minus reference log-prob of the chosen
#: responses, nats: negative when the chosen likelihood falls) has no TRL name and follows theirs;
#: ``eval_loss`` keeps its own name, TRL's.
HELD_OUT_COLUMNS: dict[str, str] = {
    "eval_reward_accuracy": "eval_rewards/accuracies",
    "eval_reward_margin": "eval_rewards/margins",
    "eval_rewards_chosen": "eval_rewards/chosen",
    "eval_logps_chosen": "eval_logps/chosen",
    "eval_chosen_drift": "eval_logps/chosen_drift",
}
#: Every score of one eval point (StepRecord and TrialResult fields alike).
HELD_OUT_FIELDS: tuple[str, ...] = (*HELD_OUT_COLUMNS, "eval_loss")
#: Field of each column (the reverse of HELD_OUT_COLUMNS), for reading the files back.
FIELD_OF_COLUMN: dict[str, str] = {c: f for f, c in HELD_OUT_COLUMNS.items()}
