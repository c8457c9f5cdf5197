"""A catalog of common training cards: memory, peak dense bf16 rate and memory bandwidth.

What a user plans with before any GPU is in hand: ``dpo-sweep validate SPACE --gpu L4,A100-80GB``
sizes every configuration against each card's memory, ``--memory-budget-gb H100`` takes a card's
memory as the budget, and the forecast scales a measured step time to another card by the ratio
of these rates (plainly labelled an estimate).

* **memory_gb**: what the card reports as its total (NVML's ``memory.total``, the figure
  ``nvidia-smi`` prints in MiB and ``dpo-sweep run`` reads as the card budget), in GB = 1e9 bytes.
  It is more than the marketed size in GiB-or-GB shorthand (an "80 GB" H100 reports 81,559 MiB =
  85.52 GB) and less than nothing else: the CUDA context (the memory model's ``context`` part) is
  taken out of it by the prediction, not here. A card with ECC switched off, or another board
  variant, may report a little more or less; give ``--memory-budget-gb`` a number then.
* **bf16_tflops**: the datasheet's peak dense (no 2:4 sparsity) bf16 tensor-core rate; datasheets
  that quote "with sparsity" figures are halved. The T4 has no bf16 tensor cores: its fp16 rate is
  given and ``bf16`` is False.
* **bandwidth_gb_s**: the datasheet's peak memory bandwidth.

Standard library only: the CLI's argument parsing reads it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Card:
    """One GPU model as the catalog knows it."""

    name: str              # what --gpu takes (case, spaces, '-' and '_' ignored)
    reported_mib: int      # NVML memory.total, as nvidia-smi prints it
    bf16_tflops: float     # peak dense tensor-core rate (fp16 where bf16 is False)
    bandwidth_gb_s: float  # peak memory bandwidth
    source: str            # the vendor datasheet the rates and the marketed size come from
    marketed: str          # the size on the datasheet
    aliases: tuple[str, ...] = ()
    nvml_pattern: str = ""  # a regex on the upper-cased device name (torch / NVML) that is this card
    bf16: bool = True       # native bf16 tensor cores

    @property
    def memory_gb(self) -> float:
        """The card's memory as it reports it, in GB (1e9 bytes)."""
        return self.reported_mib * MIB / 1e9

    def line(self) -> str:
        rate = f"{self.bf16_tflops:g} TFLOP/s dense {'bf16' if self.bf16 else 'fp16 (no bf16 tensor cores)'}"
        return (f"{self.name}: {self.memory_gb:.2f} GB reported ({self.marketed} marketed), {rate}, "
                f"{self.bandwidth_gb_s:g} GB/s; source: {self.source}")


CARDS: tuple[Card, ...] = (
    Card("T4", 15360, 65.0, 320.0, "NVIDIA T4 Tensor Core GPU datasheet (fp16 65 TFLOPS mixed precision, 320 GB/s)",
         "16 GB GDDR6", nvml_pattern=r"\bT4\b", bf16=False),
    Card("L4", 23034, 121.0, 300.0, "NVIDIA L4 Tensor Core GPU datasheet (bf16 242 TFLOPS with sparsity, 300 GB/s)",
         "24 GB GDDR6", nvml_pattern=r"\bL4\b"),
    Card("A10", 23028, 125.0, 600.0, "NVIDIA A10 Tensor Core GPU datasheet (bf16 125 TFLOPS, 250 with sparsity; 600 GB/s)",
         "24 GB GDDR6", nvml_pattern=r"\bA10\b"),
    Card("RTX4090", 24564, 165.2, 1008.0, "NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 "
         "(bf16 with fp32 accumulate 165.2 TFLOPS dense; 1,008 GB/s)", "24 GB GDDR6X", aliases=("4090", "RTX-4090"),
         nvml_pattern=r"\bRTX 4090\b"),
    Card("A6000", 49140, 154.8, 768.0, "NVIDIA RTX A6000 datasheet (tensor 309.7 TFLOPS with sparsity; 768 GB/s)",
         "48 GB GDDR6", aliases=("RTX-A6000",), nvml_pattern=r"\bRTX A6000\b"),
    Card("L40S", 46068, 362.05, 864.0, "NVIDIA L40S datasheet (bf16 733 TFLOPS with sparsity; 864 GB/s)",
         "48 GB GDDR6", nvml_pattern=r"\bL40S\b"),
    Card("A100-40GB", 40960, 312.0, 1555.0, "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM "
         "(bf16 312 TFLOPS, 624 with sparsity; 1,555 GB/s)", "40 GB HBM2", aliases=("A100-40",),
         nvml_pattern=r"\bA100\b.*\b40GB\b"),
    Card("A100-80GB", 81920, 312.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM "
         "(bf16 312 TFLOPS; 2,039 GB/s)", "80 GB HBM2e", aliases=("A100", "A100-80"), nvml_pattern=r"\bA100\b"),
    Card("H100", 81559, 989.4, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM "
         "(bf16 1,979 TFLOPS with sparsity; 3.35 TB/s)", "80 GB HBM3", aliases=("H100-80GB", "H100-SXM"),
         nvml_pattern=r"\bH100\b(?!.*\b(PCIE|NVL)\b)"),
    Card("H200", 143771, 989.4, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM "
         "(bf16 1,979 TFLOPS with sparsity; 4.8 TB/s)", "141 GB HBM3e", aliases=("H200-141GB", "H200-SXM"),
         nvml_pattern=r"\bH200\b"),
    Card("B200", 183359, 2250.0, 7700.0, "NVIDIA HGX B200 datasheet (bf16 4.5 PFLOPS per GPU with sparsity; "
         "62 TB/s over 8 GPUs)", "180 GB HBM3e", aliases=("B200-180GB",), nvml_pattern=r"\bB200\b"),
)


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).upper()


_BY_KEY: dict[str, Card] = {_key(n): c for c in CARDS for n in (c.name, *c.aliases)}


def known_names() -> str:
    """The names --gpu takes, for a message."""
    return ", ".join(c.name for c in CARDS)


def find(name: str) -> Card | None:
    """The card called ``name`` (case, spaces, '-' and '_' ignored; aliases too), or None."""
    return _BY_KEY.get(_key(name))


class UnknownCard(ValueError):
    """A card name the catalog does not hold; the message lists the known ones."""


def card(name: str) -> Card:
    """:func:`find`, or :class:`UnknownCard` naming what is allowed."""
    found = find(name)
    if found is None:
        raise UnknownCard(f"unknown card {name!r}; known cards: {known_names()}")
    return found


def cards(names: str) -> tuple[Card, ...]:
    """``NAME[,NAME...]`` as cards, in the order given, each once."""
    picked: list[Card] = []
    for part in (p.strip() for p in names.split(",")):
        if not part:
            continue
        found = card(part)
        if found not in picked:
            picked.append(found)
    if not picked:
        raise UnknownCard(f"no card named in {names!r}; known cards: {known_names()}")
    return tuple(picked)


def budget_gb(text: str) -> float:
    """``--memory-budget-gb``'s value: a number of GB (1e9 bytes), or a card name standing for
    its reported memory (:attr:`Card.memory_gb`)."""
    try:
        return float(text)
    except ValueError:
        pass
    found = find(text)
    if found is None:
        raise UnknownCard(f"{text!r} is neither a number of GB nor a known card; known cards: {known_names()}")
    return found.memory_gb


def of_device(gpu_name: str | None) -> Card | None:
    """The catalog's card for a device name as torch or NVML gives it ("NVIDIA H100 80GB HBM3"),
    or None (no name, or a card the catalog does not hold)."""
    if not gpu_name:
        return None
    name = " ".join(re.sub(r"[-_]", " ", gpu_name.upper()).split())
    for c in CARDS:  # the more specific variant first (A100 40GB before A100)
        if c.nvml_pattern and re.search(c.nvml_pattern, name):
            return c
    return None
