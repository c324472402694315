"""An order's tickets as a PDF: one page per seat. Pure and CPU-bound: call it in a thread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from fpdf import FPDF


@dataclass(frozen=True)
class TicketDocument:
    public_id: str
    event_name: str
    email: str
    seats: Sequence[int]
    issued_at: datetime  # also the PDF's creation date, so the bytes are the same on every render


def _latin1(text: str) -> str:
    # The core PDF fonts cover Latin-1 only; anything else is shown as '?'.
    return text.encode("latin-1", "replace").decode("latin-1")


def render(doc: TicketDocument) -> bytes:
    pdf = FPDF(format=(105, 148), orientation="landscape", unit="mm")
    pdf.set_compression(False)  # plain text streams: the tickets can be checked with a byte search
    pdf.set_creation_date(doc.issued_at)
    pdf.set_title(_latin1(f"Tickets {doc.public_id}"))
    pdf.set_author("Stagedoor")
    pdf.set_auto_page_break(False)
    for seat in doc.seats:
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 20)
        pdf.cell(0, 12, "Stagedoor", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "", 14)
        pdf.cell(0, 10, _latin1(doc.event_name)[:60], new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "B", 28)
        pdf.cell(0, 18, f"Seat {seat}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Courier", "", 12)
        pdf.cell(0, 8, f"Order {doc.public_id}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "", 9)
        pdf.cell(0, 6, _latin1(doc.email)[:80], new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())
