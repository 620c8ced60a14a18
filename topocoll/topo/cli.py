"""Subcommands of this area (filled in by its owner)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this area's subcommands to the ``topocoll`` parser."""
