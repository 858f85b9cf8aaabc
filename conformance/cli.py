"""``gefen-conformance``: certification and golden checkpoints (SPEC 4.4, 5.5).

    gefen-conformance certify [--impl NAME] [--out PATH] [pytest args...]   run the suite, write the certificate
    gefen-conformance golden generate DIR [--impl NAME]   write every case and MANIFEST.json
    gefen-conformance golden check DIR                    verify DIR against its manifest
    gefen-conformance golden compare [--impl NAME] [DIR]  save with NAME, compare with the goldens
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oracles import golden_manifest

from . import golden


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gefen-conformance")
    sub = parser.add_subparsers(dest="command", required=True)
    cert = sub.add_parser("certify", help="run the conformance suite against an implementation")
    cert.add_argument("--impl", default="reference")
    cert.add_argument("--out", type=Path, default=None, help="certificate path (default ./gefen-certificate-<impl>.json)")
    cert.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments")
    g = sub.add_parser("golden", help="golden checkpoints").add_subparsers(dest="action", required=True)
    gen = g.add_parser("generate", help="write the golden cases and their manifest into DIR")
    gen.add_argument("dir", type=Path)
    gen.add_argument("--impl", default="reference")
    chk = g.add_parser("check", help="verify DIR against its MANIFEST.json")
    chk.add_argument("dir", type=Path)
    cmp_ = g.add_parser("compare", help="save the cases with an implementation and compare with the goldens")
    cmp_.add_argument("dir", type=Path, nargs="?", default=golden.GOLDEN_DIR)
    cmp_.add_argument("--impl", default="reference")
    args = parser.parse_args(argv)

    if args.command == "certify":
        import pytest

        extra = [a for a in args.pytest_args if a != "--"]
        options = ["--pyargs", "conformance", f"--impl={args.impl}", "-p", "no:cacheprovider"]
        if args.out is not None:
            options.append(f"--certificate={args.out}")
        return int(pytest.main(options + extra))
    if args.action == "generate":
        path = golden.generate_into(args.dir, args.impl)
        print(f"wrote {len(golden.CASES)} cases and {path}")
        return 0
    if args.action == "check":
        problems = golden_manifest.check(args.dir)
    else:
        problems = golden.compare_with_goldens(args.impl, args.dir)
    for line in problems:
        print(line)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
