"""The card catalog: names, memory as the card reports it, device names, the budget argument."""
from __future__ import annotations

import pytest

from dpo_sweep import cards
from dpo_sweep.cli import main


def test_the_catalog_holds_the_common_training_cards_each_with_its_source():
    names = {c.name for c in cards.CARDS}
    assert {"T4", "L4", "A10", "RTX4090", "A100-40GB", "A100-80GB", "H100", "H200", "B200", "L40S", "A6000"} <= names
    for c in cards.CARDS:
        assert "datasheet" in c.source or "whitepaper" in c.source, c.name
        assert c.bf16_tflops > 0 and c.bandwidth_gb_s > 0
        assert c.memory_gb == c.reported_mib * 1024 * 1024 / 1e9


def test_reported_memory_is_what_nvml_gives_in_gb():
    # The committed H200 runs' environment.json: 150.755 GB (NVML total / 1e9).
    assert cards.card("H200").memory_gb == pytest.approx(150.755, abs=5e-4)
    assert f"{cards.card('H100').memory_gb:.2f}" == "85.52"
    assert cards.card("A10").memory_gb == 24146608128 / 1e9  # NVML total of an A10 in bytes


def test_names_ignore_case_spaces_dashes_and_take_aliases():
    assert cards.card("a100_80gb") is cards.card("A100 80GB") is cards.card("A100")
    assert cards.card("rtx 4090") is cards.card("4090")
    assert cards.cards("L4, h100,L4") == (cards.card("L4"), cards.card("H100"))


def test_an_unknown_card_names_the_known_ones():
    with pytest.raises(cards.UnknownCard, match=r"unknown card 'V100'; known cards: T4, L4, .*B200"):
        cards.card("V100")


def test_device_names_map_to_their_card_and_variants_stay_apart():
    assert cards.of_device("NVIDIA H100 80GB HBM3").name == "H100"
    assert cards.of_device("NVIDIA H100 PCIe") is None  # another bandwidth and rate: not the SXM card
    assert cards.of_device("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert cards.of_device("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert cards.of_device("NVIDIA L40S").name == "L40S"
    assert cards.of_device("NVIDIA L4").name == "L4"
    assert cards.of_device("NVIDIA A10G") is None and cards.of_device("NVIDIA A10").name == "A10"
    assert cards.of_device("NVIDIA GeForce RTX 4090").name == "RTX4090"
    assert cards.of_device(None) is None and cards.of_device("cpu") is None


def test_mfu_takes_the_catalog_s_sustained_rate_where_measured_else_its_datasheet_rate():
    for name, device in (("H100", "NVIDIA H100 80GB HBM3"), ("A100-80GB", "NVIDIA A100-SXM4-80GB"),
                         ("L4", "NVIDIA L4"), ("L40S", "NVIDIA L40S"), ("B200", "NVIDIA B200")):
        assert cards.mfu_peak_flops(device) == cards.card(name).bf16_tflops * 1e12
    h200 = cards.card("H200")  # one card, two named rates: the datasheet's and the one measured on it
    assert (h200.bf16_tflops, h200.sustained_bf16_tflops) == (989.4, 790.0)
    assert cards.mfu_peak_flops("NVIDIA H200") == 790e12 and cards.mfu_peak_flops("NVIDIA H200 NVL") == 836e12
    assert cards.mfu_peak_flops("Tesla T4") is None  # no bf16 tensor cores


def test_budget_takes_a_number_or_a_card():
    assert cards.budget_gb("24") == 24.0
    assert cards.budget_gb("h100") == cards.card("H100").memory_gb
    with pytest.raises(cards.UnknownCard, match="neither a number of GB nor a known card; known cards: T4"):
        cards.budget_gb("lots")


@pytest.mark.parametrize("argv", [["validate", "search_spaces/quickstart.yaml", "--gpu", "L4,V100"],
                                  ["recommend", "nowhere", "--memory-budget-gb", "V100"],
                                  ["report", "nowhere", "--memory-budget-gb", "V100"]])
def test_an_unknown_card_on_the_command_line_exits_2_listing_the_known_ones(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "V100" in err and "known cards: T4, L4, A10" in err


def test_the_planner_docs_table_is_the_catalog():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text()
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in text.splitlines() if line.startswith("| "))}
    for c in cards.CARDS:
        assert c.name in rows, c.name
        cells = rows[c.name]
        assert cells[1] == f"{c.memory_gb:.2f}" and cells[2] == c.marketed
        assert float(cells[3].split()[0].replace(",", "")) == c.bf16_tflops
        assert float(cells[4].replace(",", "")) == c.bandwidth_gb_s
        assert float(cells[5].split()[0]) == c.interconnect_gb_s
