"""Print the README's two quick-start commands, one per line (install+detect, then tests).

.ci/run executes exactly these lines, so CI proves what a new user types and the README
cannot drift from CI. The block is the first ```bash fence under '## Quick start'.
"""
from __future__ import annotations

import sys
from pathlib import Path


def quick_start(readme: Path) -> tuple[str, str]:
    lines = readme.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index("## Quick start")
        fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```bash")
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    except (ValueError, StopIteration):
        raise SystemExit(f"{readme}: no ```bash block under '## Quick start'") from None
    cmds = [ln.strip() for ln in lines[fence + 1:end] if ln.strip() and not ln.strip().startswith("#")]
    if len(cmds) != 2:
        raise SystemExit(f"{readme}: the quick start must be exactly two commands, found {cmds}")
    return cmds[0], cmds[1]


if __name__ == "__main__":
    print("\n".join(quick_start(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md"))))
