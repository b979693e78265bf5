"""The page of a `parity fuzz` run: `write_page(summary, out)` renders OUT/fuzz.json's summary
as one static HTML file (no script, no network): where the subject ran, the minimal failing
cases found (with their records, repro bundle and the command that replays found.json), the
worst margin per op, dtype and tensor, and every search. Strings from the summary reach the
page only through jinja2's autoescape."""

from __future__ import annotations

from pathlib import Path

import jinja2

PAGE = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>parity fuzz: {{ s.subject }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222 }
table { border-collapse: collapse; margin: .5em 0 1.5em } td, th { border: 1px solid #ccc; padding: .2em .5em; text-align: left }
th { background: #f3f3f3 } td.num { text-align: right; font-variant-numeric: tabular-nums }
.fail { color: #b00020; font-weight: bold } .near { color: #a65c00 } .ok { color: #1b6e20 } code { font-size: 90% }
</style></head><body>
<h1>parity fuzz: {{ "the reference " ~ s.subject ~ " against the oracle" if s.reference_searched else "candidate " ~ s.subject }}</h1>
<p>Backends {{ s.backends | join(", ") }}; ops {{ s.ops | join(", ") }}; {{ s.searches | length }} search(es) of
{{ s.time_s }} s (shrinking up to {{ s.shrink_time_s }} s more), seed {{ s.seed }}, cases up to {{ s.max_elements }}
input elements; {{ "%.0f" | format(s.wall_s) }} s in all. {{ s.subject }} ran on: {{ s.platforms | join(", ") or "nothing" }}.</p>
<h2>Found ({{ s.found | length }})</h2>
{% if s.found %}
<p>Replay them as a regression suite: <code>parity run --cases {{ found_json }} --backends oracle{{ ",fla" if "fla" in s.backends else "" }}{{ " --candidate " ~ s.candidate if s.candidate else "" }}</code></p>
<table><tr><th>minimal case</th><th>verdict</th><th>what failed</th><th>found after</th><th>records</th><th>repro</th></tr>
{% for f in s.found %}<tr><td><code>{{ f.case_id }}</code></td><td class="fail">{{ f.verdict }}{{ " (a finding about the reference)" if s.reference_searched else "" }}</td>
<td>{{ f.detail }}</td><td class="num">{{ "%.0f s" | format(f.time_to_find_s) if f.time_to_find_s is not none else "-" }}</td>
<td><code>{{ f.records }}</code></td><td><code>{{ f.repro }}</code></td></tr>
{% endfor %}</table>
{% else %}<p class="ok">No failing case in {{ examples }} examples.</p>{% endif %}
<h2>Worst margins (eps / limit; above 1 fails)</h2>
{% for op, worst in s.worst.items() %}<h3>{{ op }}</h3>
<table><tr><th>dtype</th><th>tensor</th><th>ratio</th><th>margin</th><th>case</th></tr>
{% for key in worst | sort %}{% set w = worst[key] %}{% set p = key.split("/", 2) %}
<tr><td>{{ p[0] }}</td><td>{{ p[1] }}</td><td>{{ p[2] }}</td>
<td class="num {{ 'fail' if w.margin == 'inf' or w.margin > 1 else 'near' if w.margin > 0.5 else 'ok' }}">{{ w.margin if w.margin == "inf" else "%.3g" | format(w.margin) }}</td>
<td><code>{{ w.case_id }}</code></td></tr>
{% endfor %}</table>
{% endfor %}
<h2>Searches</h2>
<table><tr><th>op</th><th>#</th><th>seed</th><th>examples</th><th>unsupported</th><th>oracle failed</th><th>stopped by</th>
<th>time to find</th><th>shrink</th><th>minimal</th></tr>
{% for r in s.searches %}<tr><td>{{ r.op }}</td><td class="num">{{ r.index }}</td><td class="num">{{ r.seed }}</td>
<td class="num">{{ r.examples }}</td><td class="num">{{ r.unsupported }}</td><td class="num">{{ r["oracle-failed"] }}</td>
<td>{{ r.stopped }}</td><td class="num">{{ "%.0f s" | format(r.time_to_find_s) if r.time_to_find_s is not none else "-" }}</td>
<td class="num">{{ "%.0f s" | format(r.shrink_s) if r.shrink_s is not none else "-" }}</td><td><code>{{ r.minimal or "" }}</code></td></tr>
{% endfor %}</table>
</body></html>
""")


def write_page(summary: dict, out: Path) -> Path:
    """Write the page for a fuzz summary (parity.fuzz.run_fuzz) to `out`; returns its path."""
    out = Path(out)
    html = PAGE.render(
        s=summary, found_json=out.parent / "found.json", examples=sum(r["examples"] for r in summary["searches"])
    )
    out.write_text(html, encoding="utf-8")
    return out
