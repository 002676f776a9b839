"""Fail unless this environment has the versions a pins file (``name==version`` lines) names."""

import sys
from importlib.metadata import PackageNotFoundError, version

pins = {}
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, pinned = (part.strip() for part in line.split("=="))
        pins[name] = pinned
wrong = {}
for name, pinned in pins.items():
    try:
        installed = version(name)
    except PackageNotFoundError:
        installed = "not installed"
    if installed.split("+")[0] != pinned:
        wrong[name] = f"pinned {pinned}, installed {installed}"
if wrong:
    sys.exit(f"{sys.prefix} does not have the versions of {sys.argv[1]}: {wrong}. Rebuild it (rm -r {sys.prefix}).")
print(f"{sys.prefix}: {', '.join(f'{k} {v}' for k, v in pins.items())}")
