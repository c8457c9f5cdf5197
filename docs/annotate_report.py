"""The README's quickstart sample and screenshot, from a fresh quickstart run.

    dpo-sweep run search_spaces/quickstart.yaml --output /tmp/qs
    python docs/annotate_report.py --refresh /tmp/qs

copies the run's results.csv to docs/images/quickstart-results.csv, rewrites the README's frontier
sample (the header and the first two rows of frontier.md's table) and its recommended line from it,
writes a copy of the run's report.html with numbered badges on the parts the README explains, and
screenshots it at 1280 px into docs/images/quickstart-report.png with headless Chromium, recording
the results file's SHA-256 in docs/images/quickstart-report.json. tests/test_readme_sample.py
fails when any of these no longer match each other or the quickstart space.

    python docs/annotate_report.py REPORT.html OUT.html     (only the badges)
"""
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
RESULTS = IMAGES / "quickstart-results.csv"
SCREENSHOT = IMAGES / "quickstart-report.png"
STAMP = IMAGES / "quickstart-report.json"
WINDOW = (1280, 2700)
#: Rows of the frontier table the README shows before "...".
SAMPLE_ROWS = 2

#: (CSS selector, badge number): the numbers the README's "Reading the report" list uses.
BADGES = (("#recommendation", 1), ("#use-it", 2), ("#summary", 3), ("#plot-memory-time", 4),
          ("#plot-dimensions", 5))
SCRIPT = """<style>.badge{position:absolute;z-index:10;width:34px;height:34px;border-radius:50%;
background:#d62728;color:#fff;font:bold 20px/34px sans-serif;text-align:center;
box-shadow:0 0 0 3px #fff}</style><script>
function place() {  // once the plots are drawn: they set their heights
  if (!document.body.hasAttribute("data-plots-ready")) return setTimeout(place, 100);
  [BADGES].forEach(function (b) {
    var el = document.querySelector(b[0]); if (!el) return;
    var r = el.getBoundingClientRect(), s = document.createElement("span");
    s.className = "badge"; s.textContent = b[1];
    s.style.left = Math.max(2, r.left - 40 + window.scrollX) + "px"; s.style.top = (r.top + window.scrollY) + "px";
    document.body.appendChild(s);
  });
}
place();</script>"""


def annotate(src: str, out: str) -> None:
    badges = ",".join(f'["{sel}", {n}]' for sel, n in BADGES)
    html = Path(src).read_text(encoding="utf-8")
    Path(out).write_text(html.replace("</body>", SCRIPT.replace("BADGES", badges) + "</body>"), encoding="utf-8")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sample_block(frontier_table: str) -> str:
    """The README's sample: the table's header and its first SAMPLE_ROWS rows, then "..."."""
    lines = frontier_table.strip().splitlines()
    return "\n".join([lines[0], *lines[2:2 + SAMPLE_ROWS], "..."])


def readme_sample(readme: str) -> str:
    """The sample block as the README has it (the fenced block under the frontier-table step)."""
    match = re.search(r"3\. the frontier table.*?```\n(.*?)\n\s*```", readme, re.S)
    return "\n".join(line.strip() for line in match.group(1).splitlines()) if match else ""


def refresh(run_dir: str) -> None:
    sys.path.insert(0, str(ROOT))
    from dpo_sweep.commands.report import analyse_dir

    run = Path(run_dir)
    outcome = analyse_dir(run)
    shutil.copyfile(run / "results.csv", RESULTS)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    old = readme_sample(readme)
    new = sample_block(outcome.frontier_markdown)
    indent = "   "
    readme = readme.replace("\n".join(indent + line for line in old.splitlines()),
                            "\n".join(indent + line for line in new.splitlines()))
    first_line = outcome.recommendation_text.splitlines()[0].split("  ", 1)
    readme = re.sub(r"\(`recommended: \S+\s+micro_batch=[^`]*`", "(`" + first_line[0] + "  " + first_line[1] + "`",
                    readme, count=1)
    readme_path.write_text(readme, encoding="utf-8")
    annotated = run / "annotated.html"
    annotate(str(outcome.report_path), str(annotated))
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=15000", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                    f"--screenshot={SCREENSHOT}", annotated.resolve().as_uri()], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    STAMP.write_text(json.dumps({"results_sha256": sha256(RESULTS), "window": list(WINDOW)}, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--refresh":
        refresh(sys.argv[2])
    else:
        annotate(*sys.argv[1:3])
