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
* **sustained_bf16_tflops**: the dense bf16 rate measured on the card, where it was (the H200's
  790); MFU's denominator (:func:`mfu_peak_flops`, which also knows the rates of a few devices
  the catalog does not size), the datasheet's rate where it is None.
* **bandwidth_gb_s**: the datasheet's peak memory bandwidth.
* **interconnect_gb_s**: the datasheet's GPU-to-GPU bandwidth in one direction (NVLink's
  bidirectional figure halved; PCIe x16 where the card has no NVLink: Gen4 32, Gen3 16, Gen5 64):
  what a simulated multi-GPU trial's modelled communication time divides its bytes by
  (core/comms.py).

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
    bf16_tflops: float     # the datasheet's peak dense tensor-core rate (fp16 where bf16 is False)
    bandwidth_gb_s: float  # peak memory bandwidth
    source: str            # the vendor datasheet the rates and the marketed size come from
    marketed: str          # the size on the datasheet
    aliases: tuple[str, ...] = ()
    nvml_pattern: str = ""  # a regex on the upper-cased device name (torch / NVML) that is this card
    bf16: bool = True       # native bf16 tensor cores
    interconnect_gb_s: float = 32.0  # GPU-to-GPU, one direction (NVLink, else PCIe x16)
    #: The sustained dense bf16 rate measured on the card (large square GEMMs), TFLOP/s: MFU's
    #: denominator where it is known (None: the datasheet's bf16_tflops), so that MFU is relative
    #: to what the card reaches; the forecast's card-to-card ratio keeps the datasheet's.
    sustained_bf16_tflops: float | None = None

    def mfu_peak_flops(self) -> float | None:
        """MFU's denominator, FLOP/s: the sustained rate where measured, else the datasheet's;
        None without bf16 tensor cores (an MFU against the fp16 rate would mislead)."""
        if not self.bf16:
            return None
        return 1e12 * (self.sustained_bf16_tflops if self.sustained_bf16_tflops is not None else self.bf16_tflops)

    @property
    def memory_gb(self) -> float:
        """The card's memory as it reports it, in GB (1e9 bytes)."""
        return self.reported_mib * MIB / 1e9

    def line(self) -> str:
        rate = f"{self.bf16_tflops:g} TFLOP/s dense {'bf16' if self.bf16 else 'fp16 (no bf16 tensor cores)'}"
        return (f"{self.name}: {self.memory_gb:.2f} GB reported ({self.marketed} marketed), {rate}, "
                f"{self.bandwidth_gb_s:g} GB/s, {self.interconnect_gb_s:g} GB/s GPU-to-GPU; source: {self.source}")


CARDS: tuple[Card, ...] = (
    Card("T4", 15360, 65.0, 320.0, "NVIDIA T4 Tensor Core GPU datasheet (fp16 65 TFLOPS mixed precision, 320 GB/s)",
         "16 GB GDDR6", nvml_pattern=r"\bT4\b", bf16=False, interconnect_gb_s=16.0),
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
         "(bf16 312 TFLOPS, 624 with sparsity; 1,555 GB/s; NVLink 600 GB/s)", "40 GB HBM2", aliases=("A100-40",),
         nvml_pattern=r"\bA100\b.*\b40GB\b", interconnect_gb_s=300.0),
    Card("A100-80GB", 81920, 312.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM "
         "(bf16 312 TFLOPS; 2,039 GB/s; NVLink 600 GB/s)", "80 GB HBM2e", aliases=("A100", "A100-80"),
         nvml_pattern=r"\bA100\b", interconnect_gb_s=300.0),
    Card("H100", 81559, 989.4, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM "
         "(bf16 1,979 TFLOPS with sparsity; 3.35 TB/s; NVLink 900 GB/s)", "80 GB HBM3", aliases=("H100-80GB", "H100-SXM"),
         nvml_pattern=r"\bH100\b(?!.*\b(PCIE|NVL)\b)", interconnect_gb_s=450.0),
    # H200: MFU is taken against 790 TFLOP/s, the sustained bf16 matmul throughput of large square
    # GEMMs measured on this workplace's H200s, not the datasheet's 989.4 (`mfu` in docs/results.md).
    Card("H200", 143771, 989.4, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM "
         "(bf16 1,979 TFLOPS with sparsity; 4.8 TB/s; NVLink 900 GB/s)", "141 GB HBM3e", aliases=("H200-141GB", "H200-SXM"),
         nvml_pattern=r"\bH200\b", interconnect_gb_s=450.0, sustained_bf16_tflops=790.0),
    Card("B200", 183359, 2250.0, 7700.0, "NVIDIA HGX B200 datasheet (bf16 4.5 PFLOPS per GPU with sparsity; "
         "62 TB/s over 8 GPUs; NVLink 1.8 TB/s)", "180 GB HBM3e", aliases=("B200-180GB",), nvml_pattern=r"\bB200\b",
         interconnect_gb_s=900.0),
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


#: Dense bf16 rates (FLOP/s) of devices MFU knows that the catalog does not size (their reported
#: memory is not recorded here), by a regex on the normalised device name; matched before the
#: catalog, since some are variants of a catalog card (H200 NVL, H100 PCIe, A10G).
OTHER_MFU_PEAKS: tuple[tuple[str, float], ...] = (
    (r"\bGH200\b", 989e12), (r"\bH200\b.*\bNVL\b", 836e12), (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b.*\bPCIE\b", 756e12), (r"\bH800\b", 989e12), (r"\bA800\b", 312e12),
    (r"\bA10G\b", 70e12),  # AWS variant of the A10, lower clocks
    (r"\bL40\b", 181e12), (r"\bRTX 3090\b", 71e12),
)


def _device_name(gpu_name: str) -> str:
    return " ".join(re.sub(r"[-_]", " ", gpu_name.upper()).split())


def mfu_peak_flops(gpu_name: str | None) -> float | None:
    """MFU's denominator for a device name as torch or NVML gives it, FLOP/s (:meth:`Card.mfu_peak_flops`,
    else :data:`OTHER_MFU_PEAKS`); None for no name, the CPU, or a device without a bf16 rate here."""
    if not gpu_name:
        return None
    name = _device_name(gpu_name)
    for pattern, flops in OTHER_MFU_PEAKS:
        if re.search(pattern, name):
            return flops
    card = of_device(gpu_name)
    return card.mfu_peak_flops() if card is not None else None


def of_device(gpu_name: str | None) -> Card | None:
    """The catalog's card for a device name as torch or NVML gives it ("NVIDIA H100 80GB HBM3"),
    or None (no name, or a card the catalog does not hold)."""
    if not gpu_name:
        return None
    name = _device_name(gpu_name)
    for c in CARDS:  # the more specific variant first (A100 40GB before A100)
        if c.nvml_pattern and re.search(c.nvml_pattern, name):
            return c
    return None
