"""Render :class:`ReportData` into one self-contained HTML file (opens offline, no CDN).

plotly.js (the vendored basic bundle, gzipped and base64-encoded: :func:`packed_js`) is inlined
once, however many plots there are; the figure specs travel as one JSON
block inside a ``<script type="application/json">`` element, with ``<``, ``>``, ``&`` and the
JS line separators written as ``\\uXXXX`` escapes so no data string can close the element.
Everything else goes through jinja2 with autoescape on.
"""
from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import jinja2

from dpo_sweep.report.data import ReportData
from dpo_sweep.files import write_text_atomic
from dpo_sweep.results_dir import ResultsDir

TEMPLATE_DIR = Path(__file__).parent / "templates"
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_safe_json(value: Any) -> str:
    """JSON text that is safe inside a <script> element (strict JSON: NaN is an error)."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for char, escape in _JSON_ESCAPES.items():
        text = text.replace(char, escape)
    return text


#: plotly.js's basic bundle (scatter, bar, pie; 1.2 MB), vendored: the report draws only SVG
#: scatter traces, and the plotly package's full bundle (4.8 MB, maps and 3-D) would make every
#: report 5 MB. vendor/README.md says where it comes from and how to update it.
PLOTLY_BUNDLE = Path(__file__).parent / "vendor" / "plotly-basic.min.js"


def plotly_js() -> str:
    """The vendored plotly.js bundle (no network)."""
    return PLOTLY_BUNDLE.read_text(encoding="utf-8")


def packed_js(js: str) -> str:
    """``js`` gzipped and base64-encoded, as the page's loader unpacks it (DecompressionStream):
    1.2 MB of plotly.js become 0.53 MB, so a report stays under 1.5 MB with room for 100 trials'
    curves. Deterministic (no timestamp in the gzip header): the same report, the same bytes.
    Base64's alphabet cannot close the <script> element that holds it."""
    return base64.b64encode(gzip.compress(js.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=True,  # every data string is escaped unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


#: A table of more columns than this is set in smaller type (``table.wide``): the all-trials table
#: of a sweep over the levers has 21, which at the normal size overflow 1280 px by 70 px.
WIDE_TABLE_COLUMNS = 19


def render_html(data: ReportData, js: str | None = None) -> str:
    """The report page. ``js``: plotly.js source (default: the installed bundle)."""
    figures = [{"id": f.dom_id, **f.spec} for f in data.figures]
    template = _environment().get_template("report.html.j2")
    return template.render(
        data=data,
        figure_json=script_safe_json(figures),
        filter_json=script_safe_json(data.filter_data),
        recommendation_text=json.dumps(data.recommendation_json, indent=2, ensure_ascii=False),
        plotly_packed=packed_js(plotly_js() if js is None else js),
        WIDE_TABLE_COLUMNS=WIDE_TABLE_COLUMNS,
        files=ResultsDir,  # the folder's file names, as the page mentions them
    )


def write_report(path: str | Path, data: ReportData) -> Path:
    path = Path(path)
    write_text_atomic(path, render_html(data))
    return path
