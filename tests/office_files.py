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
