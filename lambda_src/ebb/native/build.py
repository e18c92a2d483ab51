"""Build Ebb's compiled kernels: ``python -m ebb.native`` (or, with the standard library
only, as in the worker image's build stage, ``python build.py``).

The library is named for the machine (``_kernels.x86_64.so``, ``_kernels.aarch64.so``) so
that a build for one architecture is never loaded on another.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SOURCES = (Path(__file__).with_name("kernels.c"), Path(__file__).with_name("train.c"))
LIBRARY = Path(__file__).with_name(f"_kernels.{platform.machine()}.so")
# No fast-math and no fused multiply-add: the kernels must round as numpy does. Without
# trapping math the compiler may turn a comparison into a mask and vectorise the loop (the
# results are the same; only floating-point exceptions, which nothing traps, could differ);
# without errno, sqrtf is one instruction (nothing reads errno).
CFLAGS = (
    "-O3",
    "-std=c99",
    "-fPIC",
    "-shared",
    "-fno-fast-math",
    "-ffp-contract=off",
    "-fno-trapping-math",
    "-fno-math-errno",
)


def build(out: Path = LIBRARY, cc: str | None = None) -> Path:
    """Compile ``kernels.c`` and ``train.c`` into ``out`` with the C compiler ``cc`` (default $CC, cc, gcc)."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc or gcc) on PATH: Ebb runs without its kernels, on numpy")
    tmp = out.with_name(out.name + ".tmp")
    subprocess.run([cc, *CFLAGS, "-o", str(tmp), *map(str, SOURCES), "-lm"], check=True)
    tmp.replace(out)  # atomically: a running process keeps the file it loaded
    return out


def main(argv: list[str] | None = None, loads: Callable[[Path], bool] | None = None) -> int:
    """The command line; ``loads(path)`` says whether a built library loads (``--check``;
    ``python -m ebb.native`` passes the package's loader)."""
    ap = argparse.ArgumentParser(
        prog="python -m ebb.native",
        description=(
            "Build Ebb's compiled kernels: ISP's payload decoding in one pass per loop, and PMF's and "
            "sparse LR's training steps in one pass over a minibatch. Optional: without them the engine "
            "does the same arithmetic in numpy and torch, a few times slower in those loops. scripts/setup.sh and "
            "the worker image build them."
        ),
    )
    ap.add_argument("--out", type=Path, default=LIBRARY, help=f"the shared library to write (default {LIBRARY})")
    ap.add_argument("--cc", help="the C compiler (default $CC, then cc, then gcc)")
    ap.add_argument("--check", action="store_true", help="only say whether the kernels load here; exit 1 if not")
    args = ap.parse_args(argv)
    if args.check:
        if loads is None:
            print("--check needs the ebb package: python -m ebb.native --check", file=sys.stderr)
            return 2
        ok = loads(args.out)
        print(f"{args.out}: {'loads' if ok else 'missing, stale or not loadable (EBB_NATIVE=0 also says no)'}")
        return 0 if ok else 1
    try:
        path = build(args.out, args.cc)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"ebb.native: {exc}", file=sys.stderr)
        return 1
    print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
