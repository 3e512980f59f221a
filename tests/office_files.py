"""Real HTML, PDF, Word and PowerPoint files built at test time (fpdf2, python-docx, python-pptx).

Each builder takes the same outline: a title, sections of paragraphs under a heading, and a table
of codes. bench/ingest_bench.py builds its mixed knowledge base from the same outlines.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Outline:
    title: str
    sections: tuple[tuple[str, tuple[str, ...]], ...]
    table_heading: str
    table: tuple[tuple[str, ...], ...]  # the first row is the header
    bullets: tuple[str, ...] = field(default=())


# Four documents on four topics, one per format in tests/test_formats.py.
TRAVEL = Outline(
    title="Travel policy",
    sections=(
        (
            "Hotels",
            (
                "Employees travelling on company business book hotels through the corporate travel portal. "
                "The nightly rate may not exceed 180 euros in Berlin, Munich and Hamburg, and 140 euros in "
                "every other city. A more expensive hotel needs the written approval of your cost centre "
                "owner before you book it, and the approval is attached to the expense report.",
                "Breakfast is included in the hotel rate where the hotel offers it. Minibar, laundry and "
                "pay television are private expenses and are never reimbursed, whatever the length of the "
                "trip. Cancel unused nights at least 24 hours ahead; late cancellation fees are charged "
                "to your cost centre.",
            ),
        ),
        (
            "Trains and flights",
            (
                "Trips that take less than four hours by train are made by train, in second class. First "
                "class is allowed for trips longer than four hours or when you travel overnight. Flights "
                "inside Germany need the approval of your manager and are booked in economy class only. "
                "Rental cars are the last resort and must be small or compact cars.",
                "Frequent flyer miles earned on business trips may be kept, but they must never decide "
                "which airline or route is booked. Travel insurance is provided by the company for every "
                "trip booked through the portal, so do not buy insurance of your own.",
            ),
        ),
    ),
    table_heading="Expense codes",
    table=(
        ("Code", "Meaning", "Receipt needed"),
        ("TRV_HOTEL_042", "Hotel night within the city cap", "yes"),
        ("TRV_TAXI_007", "Taxi or ride share to the station", "above 25 euros"),
    ),
)
FIRST_WEEK = Outline(
    title="First week guide",
    sections=(
        (
            "First day",
            (
                "On your first day, come to the reception desk B on the third floor of the north building "
                "at 09:30. The receptionist hands you a visitor pass, and your team lead collects you "
                "there. Your permanent badge is printed during the morning once security has your photo; "
                "bring a passport or an identity card, as a driving licence is not accepted.",
                "The morning ends with a tour of the building: the kitchen on every floor, the quiet rooms "
                "on the fourth floor, and the bicycle cellar whose door opens with your badge.",
            ),
        ),
        (
            "Laptop setup",
            (
                "Your laptop is waiting at your desk, already enrolled in device management. Sign in with "
                "the temporary password from your welcome email and change it at once. Install the VPN "
                "client from the self-service portal before you leave the office on your first day, "
                "because the portal cannot be reached from outside without it.",
                "Developers request access to the source code repositories through the access request "
                "form; approval by the team lead usually arrives the same afternoon.",
            ),
        ),
    ),
    bullets=("A passport or identity card", "Your bank details for the payroll form"),
    table_heading="Access request codes",
    table=(
        ("Code", "Access", "Approver"),
        ("ONB_BADGE_311", "Permanent building badge", "Security desk"),
        ("ONB_REPO_204", "Source code repositories", "Team lead"),
    ),
)
OUTAGE = Outline(
    title="Database outage review",
    sections=(
        (
            "Timeline",
            (
                "At 03:12 the primary database in Frankfurt stopped accepting writes after its disk latency "
                "rose above two seconds. Automatic failover promoted the replica at 03:19, and the checkout "
                "service recovered at 03:31 once its connection pool had been recycled by hand. "
                "The outage lasted 19 minutes for writes and 7 minutes for reads.",
            ),
        ),
        (
            "Root cause",
            (
                "A nightly backup job and a schema migration ran at the same time on the primary and "
                "saturated the disk. The backup job had been moved to 03:00 a week earlier without "
                "checking the migration schedule. From now on backups run on the replica only, and "
                "migrations are refused while a backup runs.",
            ),
        ),
    ),
    table_heading="Alert codes seen",
    table=(
        ("Code", "Meaning"),
        ("INC_DB_FAILOVER_9", "Automatic failover to the replica started"),
        ("INC_POOL_STALE_3", "Connection pool holds connections to a demoted primary"),
    ),
)
RELEASES = Outline(
    title="Release process",
    sections=(
        (
            "Freeze window",
            (
                "No release goes to production after Thursday 16:00 until Monday 09:00. The freeze protects "
                "the weekend on-call rotation from changes nobody is around to watch. A change that must "
                "ship during the freeze needs a hotfix ticket approved by the head of engineering.",
            ),
        ),
        (
            "Release notes",
            (
                "Every release carries notes written for customers, not for engineers: what changed, who "
                "is affected and what they have to do. The product manager of the team signs them off "
                "before the release train leaves on Tuesday morning.",
            ),
        ),
    ),
    bullets=("Tag the release", "Announce it in the release channel"),
    table_heading="Hotfix codes",
    table=(
        ("Code", "Meaning"),
        ("REL_HOTFIX_77", "Hotfix approved during the freeze"),
        ("REL_ROLLBACK_12", "Release rolled back after the canary"),
    ),
)


def pdf_bytes(outline: Outline, *, chrome: str = "ACME Corp - internal use only") -> bytes:
    """A PDF with a text layer: the title and headings in larger bold type, one section a page.

    Every page carries a running header and a page number, the chrome conversion drops.
    """
    from fpdf import FPDF

    class Paged(FPDF):
        def header(self) -> None:
            self.set_font("Helvetica", "", 8)
            self.cell(0, 6, chrome, new_x="LMARGIN", new_y="NEXT")
            self.ln(8)

        def footer(self) -> None:
            self.set_y(-15)
            self.set_font("Helvetica", "", 8)
            self.cell(0, 6, f"Page {self.page_no()}", align="C")

    pdf = Paged()
    pdf.set_title(outline.title)
    page = pdf.add_page
    page()
    pdf.set_font("Helvetica", "B", 20)
    pdf.cell(0, 12, outline.title, new_x="LMARGIN", new_y="NEXT")
    for number, (heading, paragraphs) in enumerate(outline.sections):
        if number:
            page()
        pdf.set_font("Helvetica", "B", 15)
        pdf.cell(0, 10, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "", 11)
        for paragraph in paragraphs:
            pdf.multi_cell(0, 6, paragraph, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(4)
        for bullet in outline.bullets if number == 0 else ():
            pdf.multi_cell(0, 6, f"- {bullet}", new_x="LMARGIN", new_y="NEXT")
    page()
    pdf.set_font("Helvetica", "B", 15)
    pdf.cell(0, 10, outline.table_heading, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", "", 10)
    with pdf.table() as table:
        for row in outline.table:
            cells = table.row()
            for text in row:
                cells.cell(text)
    return bytes(pdf.output())


def docx_bytes(outline: Outline) -> bytes:
    """A Word document: Title style, Heading 1 sections, a bulleted list and a table."""
    import docx

    document = docx.Document()
    document.core_properties.title = outline.title
    document.add_heading(outline.title, 0)
    for number, (heading, paragraphs) in enumerate(outline.sections):
        document.add_heading(heading, 1)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
        for bullet in outline.bullets if number == 0 else ():
            document.add_paragraph(bullet, style="List Bullet")
    document.add_heading(outline.table_heading, 1)
    table = document.add_table(rows=len(outline.table), cols=len(outline.table[0]))
    for r, row in enumerate(outline.table):
        for c, text in enumerate(row):
            table.rows[r].cells[c].text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx_bytes(outline: Outline) -> bytes:
    """A presentation: a slide per section (title and body placeholder), and a slide with the table."""
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    deck.core_properties.title = outline.title
    for number, (heading, paragraphs) in enumerate(outline.sections):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = heading
        body = slide.placeholders[1].text_frame
        body.text = paragraphs[0]
        for text in (*paragraphs[1:], *(outline.bullets if number == 0 else ())):
            body.add_paragraph().text = text
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = outline.table_heading
    rows, cols = len(outline.table), len(outline.table[0])
    shape = slide.shapes.add_table(rows, cols, Inches(0.5), Inches(1.5), Inches(9), Inches(0.4 * rows))
    for r, row in enumerate(outline.table):
        for c, text in enumerate(row):
            shape.table.cell(r, c).text = text
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def html_bytes(outline: Outline) -> bytes:
    """A web page with the chrome conversion drops: scripts, styles, navigation, header and footer."""
    e = html.escape
    sections = "".join(
        f"<h2>{e(heading)}</h2>"
        + "".join(f"<p>{e(p)}</p>" for p in paragraphs)
        + ("<ul>" + "".join(f"<li>{e(b)}</li>" for b in outline.bullets) + "</ul>" if number == 0 else "")
        for number, (heading, paragraphs) in enumerate(outline.sections)
    )
    header, *rows = outline.table
    table = "<table><thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in header) + "</tr></thead><tbody>"
    table += "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{e(outline.title)}</title>
<style>body {{ font-family: sans-serif }} .promo {{ color: red }}</style>
<script>window.analytics = {{ track: function () {{}} }}; analytics.track("SitemapVisit");</script></head>
<body><header><a href="/">Intranet home</a> <a href="/search">Search the intranet</a></header>
<nav><ul><li><a href="/sitemap">Sitemap</a></li><li><a href="/careers">Careers at ACME</a></li></ul></nav>
<main><h1>{e(outline.title)}</h1>{sections}<h2>{e(outline.table_heading)}</h2>{table}</tbody></table>
<pre><code class="language-bash">release-tool status --all</code></pre></main>
<aside>Popular pages: cafeteria menu</aside><footer>Copyright 2026 ACME Corp</footer></body></html>"""
    return page.encode("utf-8")
