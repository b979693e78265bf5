"""The HTML error report: `write_report(dirs, out)` turns result records into a static page.

    out                     index.html: summary (rendered by jinja2, autoescaped) and the
                            table data as JSON in a <script type="application/json">
    <out stem>_files/       report.js, report.css, plotly.min.js (copied from the plotly
                            package) and cases/<n>.js: one small file per case with its
                            detail data, loaded by a <script> tag when the case is opened
Compile records (kind "compile", DIR/<backend>/<case>.compile.json: a candidate compiled for
TPU targets on a CPU host, nothing executed) add the TPU compile matrix to the index, a compile
column to the case table (a compile failure is the case's verdict) and a section to the detail.
The page needs no network and no server (it works from file://). Strings from results
only ever reach the page through jinja2's autoescape, JSON with '<' escaped, or
textContent in report.js.

Modules:
    build           build_report (records -> page data), write_report, write_diff_page (-> files)
    rows            the gate per case, the case table's rows, the per-case details, the summary
    compile_view    the TPU compile records: the compile matrix, column and detail section
"""

from parity.html.build import build_report, write_diff_page, write_report

__all__ = ["build_report", "write_diff_page", "write_report"]
