"""The printed TRL export pasted into the real TRL: DPOConfig and LoraConfig build from the text,
DPOTrainer loads the checkpoint (saved in bf16) in the dtype the sweep measured and trains one step.
Skipped where TRL is not installed (``pip install 'dpo-sweep[trl]'``; the ``test`` extra has it)."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl")

from test_winner import export_of, quick_space  # noqa: E402

from dpo_sweep import trl_fields  # noqa: E402
from dpo_sweep import trl_export  # noqa: E402
from family_checkpoints import family_config  # noqa: E402


def bf16_checkpoint(folder: Path) -> Path:
    """A tiny Llama saved in bfloat16, with the byte-level tokenizer: what a user's folder looks like."""
    from transformers import AutoModelForCausalLM

    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(family_config("llama")).to(torch.bfloat16).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return folder


def pairs():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"question {i}: ", "chosen": "a good answer " * 3,
                               "rejected": "a bad one " * 2} for i in range(4)])


@pytest.mark.parametrize("precision, adapter, level, dtype", [("bf16", "full", "none", torch.bfloat16),
                                                             ("fp32", "lora", "full", torch.float32)])
def test_the_printed_export_trains_one_step_in_the_measured_dtype(tmp_path, precision, adapter, level, dtype):
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    folder = bf16_checkpoint(tmp_path / "ckpt")
    raw = quick_space(tmp_path, search={"micro_batch": [2], "checkpoint_level": [level], "grad_acc": [1],
                                        "beta": [0.1]},
                      train={"precision": precision, "adapter": adapter, "max_length": 64, "lora_r": 4,
                             "lora_targets": ["q_proj", "v_proj"]})
    raw["model"] = {"name_or_path": str(folder), "attn_implementation": "sdpa"}
    _, export = export_of(tmp_path, raw, trl=trl_fields.from_installed())
    assert export.fields_from == "installed" and export.trl_version == trl.__version__
    text = trl_export.text(export)

    # the user's own run settings beside the pasted ones: one step, here, on the CPU
    yours = functools.partial(DPOConfig, output_dir=str(tmp_path / "out"), max_steps=1, use_cpu=True,
                              report_to="none", save_strategy="no", logging_steps=1)
    scope = {"DPOConfig": yours, "LoraConfig": LoraConfig}
    code = [line for line in text.splitlines() if not line.startswith("#")]
    first = next(i for i, line in enumerate(code) if line.startswith("DPOConfig("))
    exec("\n".join(code[:first] + ["args = " + code[first]] + code[first + 1:]), scope)
    args = scope["args"]
    for key, value in export.dpo_config.items():  # every exported field reached DPOConfig as written
        got = getattr(args, key)
        assert got == value or (key == "loss_type" and list(got) == value), key

    trainer = DPOTrainer(model=export.model, args=args, train_dataset=pairs(),
                         peft_config=scope.get("peft_config"))
    base = trainer.model.get_base_model() if adapter == "lora" else trainer.model
    assert next(base.parameters()).dtype == dtype  # saved in bf16; loaded as the sweep measured
    trainer.train()
    assert base.is_activation_checkpointing is (level == "full")  # the Trainer turns it on in train()
    assert trainer.state.global_step == 1
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))
