"""Render :class:`ReportData` into one self-contained HTML file (opens offline, no CDN).

plotly.js is inlined once, however many plots there are; the figure specs travel as one JSON
block inside a ``<script type="application/json">`` element, with ``<``, ``>``, ``&`` and the
JS line separators written as ``\\uXXXX`` escapes so no data string can close the element.
Everything else goes through jinja2 with autoescape on.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from dpo_sweep.report.data import ReportData

TEMPLATE_DIR = Path(__file__).parent / "templates"
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_safe_json(value: Any) -> str:
    """JSON text that is safe inside a <script> element (strict JSON: NaN is an error)."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for char, escape in _JSON_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def plotly_js() -> str:
    """The plotly.js bundle shipped with the plotly package (no network)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # would end our <script> element early
        raise RuntimeError("the installed plotly.js contains '</script'; cannot inline it")
    return js


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=True,  # every data string is escaped unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(data: ReportData, js: str | None = None) -> str:
    """The report page. ``js``: plotly.js source (default: the installed bundle)."""
    figures = [{"id": f.dom_id, **f.spec} for f in data.figures]
    template = _environment().get_template("report.html.j2")
    return template.render(
        data=data,
        figure_json=script_safe_json(figures),
        recommendation_text=json.dumps(data.recommendation_json, indent=2, ensure_ascii=False),
        plotly_js=plotly_js() if js is None else js,
    )


def write_report(path: str | Path, data: ReportData) -> Path:
    path = Path(path)
    path.write_text(render_html(data), encoding="utf-8")
    return path
