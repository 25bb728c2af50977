"""``python -m chaos``: the chaos tools.

Commands::

    python -m chaos run [--quick | --soak MINUTES] [--seed S]   the fault matrix (chaos/run.py)
    python -m chaos crash --kills N [--seed S]                  SIGKILL harness (chaos/crash.py)
    python -m chaos fuzz --cases N [--seed S]                   tar reader fuzzer (chaos/fuzz.py)
    python -m chaos serve ROOT [--faults P]                     fault-injecting server
"""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "run":
        from chaos.run import main as m
    elif cmd == "crash":
        from chaos.crash import main as m
    elif cmd == "fuzz":
        from chaos.fuzz import main as m
    elif cmd == "serve":
        from chaos.faultserver import main as m
    else:
        print(f"unknown command {cmd!r}\n\n{__doc__.strip()}", file=sys.stderr)
        return 2
    return m(rest)


if __name__ == "__main__":
    sys.exit(main())
