"""Write a copy of a report.html with numbered badges on the parts the README explains, for the
README's screenshot:

    python docs/annotate_report.py reports/quickstart/report.html /tmp/annotated.html
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=15000 \
        --window-size=1280,2700 --screenshot=docs/images/quickstart-report.png file:///tmp/annotated.html
"""
import sys
from pathlib import Path

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


def main(src: str, out: str) -> None:
    badges = ",".join(f'["{sel}", {n}]' for sel, n in BADGES)
    html = Path(src).read_text(encoding="utf-8")
    Path(out).write_text(html.replace("</body>", SCRIPT.replace("BADGES", badges) + "</body>"), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:3])
