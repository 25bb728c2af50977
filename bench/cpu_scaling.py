"""How far two processes scale on this machine: the ceiling of the target
"decode with 2 workers >= 1.9x of 1 worker".

Decodes one 256x256 JPEG (PIL -> RGB uint8, the bench's decode) in a loop in
1 process, then in 2 processes at once, nothing else running, and prints
the rate of each and their ratio; the same for a pure-Python loop.  No
loader is involved: this is what the cores give, the most any loader's
2-worker / 1-worker decode ratio can reach here.

    python bench/cpu_scaling.py [--rounds 3] [--images 1500]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import time
from typing import Any, Callable, List, Optional


def _jpeg() -> bytes:
    import numpy as np
    from PIL import Image

    img = Image.fromarray((np.random.RandomState(0).rand(256, 256, 3) * 255).astype("uint8"))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _decode(n: int, jpg: bytes) -> None:
    import numpy as np
    from PIL import Image

    for _ in range(n):
        np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))


def _spin(n: int, _: Any) -> None:
    x = 0
    for i in range(n):
        x += i * i


def _rate(k: int, fn: Callable[[int, Any], None], n: int, arg: Any) -> float:
    """Items per second of ``k`` processes running ``fn(n, arg)`` at once."""
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=fn, args=(n, arg)) for _ in range(k)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return k * n / (time.perf_counter() - t0)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=1500, help="decodes per process per round")
    args = ap.parse_args(argv)
    jpg = _jpeg()
    ratios = []
    for r in range(args.rounds):
        one, two = _rate(1, _decode, args.images, jpg), _rate(2, _decode, args.images, jpg)
        s1, s2 = _rate(1, _spin, 5_000_000, None), _rate(2, _spin, 5_000_000, None)
        ratios.append(two / one)
        print(f"round {r + 1}: JPEG decode 1 process {one:,.0f}/s, 2 processes {two:,.0f}/s: {two / one:.2f}x;"
              f"  python loop {s2 / s1:.2f}x", flush=True)
    ratios.sort()
    print(f"JPEG decode, 2 processes / 1: median {ratios[len(ratios) // 2]:.2f}x "
          f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
