"""``validate`` says what it is doing on stderr once it has taken a second (a space of 100,000
configurations takes tens of seconds here): the grid's points resolved, then each phase; on a
terminal in one line rewritten in place, in a log a line at most every 5 s; the table on stdout
is the same with or without it."""
from __future__ import annotations

import io

from dpo_sweep import space_expand
from dpo_sweep.cli import main
from dpo_sweep.commands.validate import Progress


class Clock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_nothing_in_the_first_second_then_a_line_every_5_s_and_each_phase():
    times = iter([0.0, 0.5, 1.2, 3.0, 6.3, 6.4, 12.0])
    log = io.StringIO()
    p = Progress(log, clock=lambda: next(times))  # started at 0.0
    p.points(1, 9)        # 0.5 s: quiet
    p.points(2, 9)        # 1.2 s: the first line
    p.points(3, 9)        # 3.0 s: too soon after it
    p.points(4, 9)        # 6.3 s: 5 s on
    p.say("planning", phase=True)  # 6.4 s: a new phase is always said
    p.points(5, 9)        # 12.0 s
    assert log.getvalue().splitlines() == [
        "validate: 2 of 9 points of the grid resolved (1 s)", "validate: 4 of 9 points of the grid resolved (6 s)",
        "validate: planning (6 s)", "validate: 5 of 9 points of the grid resolved (12 s)"]
    p.end()  # nothing to clear in a log
    assert log.getvalue().count("\n") == 4


def test_a_terminal_gets_one_line_rewritten_and_cleared_before_the_table():
    term = Terminal()
    p = Progress(term, clock=Clock(0.5))
    for i in range(1, 5):
        p.points(i * 1000, 4000)
    p.end()
    text = term.getvalue()
    assert "\n" not in text and text.count("\r") >= 3
    assert "validate: 4,000 of 4,000 points of the grid resolved" in text
    assert text.endswith("\r") and text.rsplit("\r", 2)[1].strip() == ""  # the line cleared


SPACE = """name: progress
model: {preset: tiny-llama}
data: {synthetic: {pairs: 64, prompt_tokens: 8, response_tokens: 8}}
train: {steps: 2, warmup_steps: 1, precision: fp32, max_length: 32}
resources: {use_gpu: false}
search: {micro_batch: [1, 2, 4], checkpoint_level: [none, L1, full], grad_acc: [1, 2, 3], beta: [0.1, 0.2]}
"""


def test_validate_says_the_points_and_its_phases_on_stderr_and_prints_the_same_table(tmp_path, capsys, monkeypatch):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    monkeypatch.setattr(Progress, "clock", staticmethod(lambda: 0.0))  # no time passes: nothing is said
    assert main(["validate", str(path)]) == 0
    quiet = capsys.readouterr()
    assert "validate:" not in quiet.err
    monkeypatch.setattr(space_expand, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(Progress, "clock", staticmethod(Clock(6.0)))  # every call 6 s on: everything is said
    assert main(["validate", str(path)]) == 0
    said = capsys.readouterr()
    assert said.out == quiet.out
    lines = said.err.splitlines()
    assert [f"validate: {n} of 54 points of the grid resolved" for n in (10, 20, 30, 40, 50)] == [
        line.rsplit(" (", 1)[0] for line in lines[:5]]
    assert [line.rsplit(" (", 1)[0] for line in lines[5:]] == [
        "validate: checking the data, models and tokenizers of 54 trial(s)",
        "validate: planning 54 trial(s) and predicting their peaks"]
