"""Check pip's dry-run reports of .ci/wheel_smoke.sh: one per supported combination of extras, resolved in
an environment that already holds torch 2.13.0 (the README's first install step).

Each combination must keep that torch (no second torch, no CUDA wheels) and resolve the host libraries to the
versions the README's support matrix states. Usage: check_resolution.py FOLDER (FOLDER/<extras>.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (extra that brings it in, distribution, accepted version prefixes) as the support matrix states them
EXPECTED = [
    ("captum", "captum", ("0.8.", "0.9.")),
    ("lens", "transformer-lens", ("3.9.",)),
    ("lens", "sae-lens", ("6.",)),
    ("lens4", "transformer-lens", ("4.",)),
    ("inseq", "inseq", ("0.7.1",)),
    ("inseq", "typeguard", ("2.",)),
]
ALWAYS = [("transformers", ("5.",))]


def main(folder: Path) -> int:
    failures = []
    reports = sorted(folder.glob("*.json"))
    if not reports:
        failures.append(f"no reports in {folder}")
    for report in reports:
        extras = set(report.stem.split(","))
        installed = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                     for item in json.loads(report.read_text())["install"]}
        problems = []
        if "torch" in installed:
            problems.append(f"pulls a second torch {installed['torch']}")
        cuda = sorted(name for name in installed if name.startswith("nvidia-"))
        if cuda:
            problems.append(f"pulls CUDA wheels {cuda}")
        wanted = [(name, prefixes) for extra, name, prefixes in EXPECTED if extra in extras] + ALWAYS
        for name, prefixes in wanted:
            version = installed.get(name)
            if version is None or not version.startswith(prefixes):
                problems.append(f"{name} resolved to {version}, expected {' or '.join(p + '*' for p in prefixes)}")
        shown = ", ".join(f"{n} {installed[n]}" for n in ("transformers", "captum", "transformer-lens", "sae-lens",
                                                          "inseq", "typeguard") if n in installed)
        print(f"{'ok  ' if not problems else 'FAIL'} [{report.stem}] {len(installed)} packages: {shown}")
        failures += [f"[{report.stem}] {p}" for p in problems]
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
