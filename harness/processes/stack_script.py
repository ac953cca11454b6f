"""The command line the scripts that measure a live stack share: their docstring as the help, and
`--model`, the shipped demo model (models/demo) unless told."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.processes.services import ROOT


def stack_script_parser(doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    return parser
