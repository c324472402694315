"""Stagedoor's producer endpoints (events, orders). Filled in by the Stagedoor work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
