"""Bad HTML, PDF and Office files: one line each with the path and the reason, exit 1, the rest ingested.

And the bounds of the conversion child: a converter that hangs is stopped at the time limit,
one that crashes or runs out of memory fails only its file, and the next file converts.
"""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from retrieval.ingest import Ingestor
from server.config.loading import load_settings
from server.container import chunking_rule, open_runtime
from storage.convert import ConversionError
from storage.convert.worker import ConversionLimits, ConversionWorker
from tests.helpers import CLI, ROOT, cli_env, write_knowledge_base
from tests.office_files import FIRST_WEEK, RELEASES, docx_bytes, html_bytes


def _encrypted_pdf() -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", "", 12)
    pdf.cell(0, 10, "Salary bands for 2027")
    pdf.set_encryption(owner_password="owner", user_password="reader")
    return bytes(pdf.output())


def _scanned_pdf() -> bytes:
    """A page with a picture of text and no text layer, as a scanner makes it."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 170, 240, style="F")
    return bytes(pdf.output())


def _zip_bomb(expanded_mb: int = 80) -> bytes:
    """A .docx-shaped zip whose document part expands from a few kilobytes to expanded_mb."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as part:
            block = b" " * (1 << 20)
            for _ in range(expanded_mb):
                part.write(block)
    return out.getvalue()


def _huge_html(megabytes: int = 50) -> bytes:
    row = b"<p>Another paragraph of a page that never ends.</p>\n"
    return b"<html><body>" + row * (megabytes * (1 << 20) // len(row) + 1) + b"</body></html>"


BAD = {
    "bad/encrypted.pdf": (_encrypted_pdf, "encrypted PDF (it needs a password)"),
    "bad/corrupt.pdf": (lambda: b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R", "not a readable PDF ("),
    "bad/scan.pdf": (_scanned_pdf, "PDF without a text layer (a scan?): run OCR on it first"),
    "bad/truncated.docx": (
        lambda: docx_bytes(FIRST_WEEK)[:20_000],
        "not a valid .docx file (damaged or truncated zip",
    ),
    "bad/bomb.docx": (_zip_bomb, "refused as a zip bomb: 0.1 MB expanding to 84 MB"),
    "bad/huge.html": (_huge_html, "file is 50.0 MB, over the 25 MB limit (conversion.max_file_mb)"),
}


@pytest.mark.slow
def test_each_bad_file_is_one_line_with_its_reason_and_the_rest_is_ingested(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {key: build() for key, (build, _) in BAD.items()}
    files["good/release-process.html"] = html_bytes(RELEASES)
    files["good/first-week.docx"] = docx_bytes(FIRST_WEEK)
    files["good/notes.md"] = "# Notes\n\nPlain markdown still goes in.\n"
    kb = write_knowledge_base(tmp_path / "kb", files)
    proc = subprocess.run(
        [*CLI, "ingest", str(kb)],
        env=cli_env(tmp_path / "data"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # nothing may hang: the whole run is bounded
    )
    failed = sorted(line for line in proc.stderr.splitlines() if line.startswith("failed: "))
    assert len(failed) == len(BAD), proc.stderr
    for line, (key, (_, reason)) in zip(failed, sorted(BAD.items()), strict=True):
        assert line.startswith(f"failed: {key}: {reason}"), line
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stdout.startswith(f"added 3, updated 0, deleted 0, skipped 0, failed {len(BAD)}")


@pytest.fixture
def faulty() -> ConversionWorker:
    return ConversionWorker(
        ConversionLimits(timeout_s=3, memory_mb=512, max_file_mb=25), module="tests.converter_faults"
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"hang", "conversion took longer than 3 s (conversion.timeout_s); stopped"),
        (b"crash", "the converter crashed (SIGSEGV); memory limit 512 MB"),
        (b"oom", "conversion needed more than 512 MB (conversion.memory_mb)"),
    ],
)
def test_a_converter_that_hangs_crashes_or_runs_out_of_memory_fails_only_its_file(
    faulty: ConversionWorker, content: bytes, reason: str
) -> None:
    page = html_bytes(RELEASES)
    try:
        assert "REL_HOTFIX_77" in faulty.convert(page, ".html").markdown
        with pytest.raises(ConversionError) as caught:
            faulty.convert(content, ".pdf")
        assert str(caught.value) == reason
        assert faulty.convert(page, ".html").title == "Release process"  # a fresh child, or the same
    finally:
        faulty.close()


def test_an_ingest_goes_on_past_a_converter_that_hangs_and_one_that_crashes(
    tmp_path: Path, e5_embedder: Any, faulty: ConversionWorker
) -> None:
    kb = write_knowledge_base(
        tmp_path / "kb",
        {"a/hangs.pdf": b"hang", "b/crashes.docx": b"crash", "c/release-process.html": html_bytes(RELEASES)},
    )
    runtime = open_runtime(load_settings(None, data_dir=tmp_path / "data"), embedder=e5_embedder)
    try:
        rule = chunking_rule(runtime.settings, e5_embedder)
        report = Ingestor(runtime.catalog, runtime.store, e5_embedder, rule=rule, converter=faulty).run(kb)
    finally:
        runtime.close()
    assert dict(report.failed) == {
        "a/hangs.pdf": "conversion took longer than 3 s (conversion.timeout_s); stopped",
        "b/crashes.docx": "the converter crashed (SIGSEGV); memory limit 512 MB",
    }
    assert report.added == ["c/release-process.html"]
