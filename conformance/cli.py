"""``gefen-conformance``: certification and golden checkpoints (SPEC 4.4, 5.5).

    gefen-conformance certify [--impl NAME] [--certificate PATH] [-- PYTEST_ARGS...]
    gefen-conformance golden generate DIR [--impl NAME]   write every case and MANIFEST.json
    gefen-conformance golden check DIR                    verify DIR against its manifest
    gefen-conformance golden compare [--impl NAME] [DIR]  save with NAME, compare with the goldens
    gefen-conformance report CERT [--format md|html] [--out PATH]   a certificate for people (SPEC 4.5)
    gefen-conformance diff OLD NEW [--margin-factor F ...]          exit 1 when NEW regressed (SPEC 4.5.4)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CERTIFY_EPILOG = """\
certify runs `python -m pytest --impl=NAME [--certificate=PATH] -p no:cacheprovider` on the whole suite.
Extra pytest arguments go after `--`, for example:
  gefen-conformance certify --impl fast -- -n 4              # 4 xdist workers
  gefen-conformance certify --impl fast -- -k reshard         # a partial run (verdict `partial`)
Paths or node ids after `--` replace the whole suite. The exit status is pytest's.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gefen-conformance")
    sub = parser.add_subparsers(dest="command", required=True)
    cert = sub.add_parser("certify", help="run the conformance suite against an implementation, write its certificate",
                          epilog=CERTIFY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cert.add_argument("--impl", default="reference",
                      help="registered name or package.module:attribute (default: reference)")
    cert.add_argument("--certificate", "--out", dest="certificate", type=Path, default=None, metavar="PATH",
                      help="certificate path (default ./gefen-certificate-<impl>.json)")
    g = sub.add_parser("golden", help="golden checkpoints").add_subparsers(dest="action", required=True)
    gen = g.add_parser("generate", help="write the golden cases and their manifest into DIR")
    gen.add_argument("dir", type=Path)
    gen.add_argument("--impl", default="reference")
    chk = g.add_parser("check", help="verify DIR against its MANIFEST.json")
    chk.add_argument("dir", type=Path)
    cmp_ = g.add_parser("compare", help="save the cases with an implementation and compare with the goldens")
    cmp_.add_argument("dir", type=Path, nargs="?", default=None)
    cmp_.add_argument("--impl", default="reference")
    from . import report_cli

    report_cli.add_subcommands(sub)
    return parser


def certify(impl: str, certificate, pytest_args: list[str]) -> int:
    """``python -m pytest --impl=IMPL ...`` in a child process: the current directory is importable
    there (as with ``python -m pytest``), and nothing this process imported shadows the suite."""
    import subprocess

    command = [sys.executable, "-m", "pytest", f"--impl={impl}", "-p", "no:cacheprovider"]
    if certificate is not None:
        command.append(f"--certificate={certificate}")
    child = subprocess.Popen(command + list(pytest_args))
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue  # Ctrl-C reached pytest too (same process group); it stops and reports


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)
    if args.command == "certify":
        return certify(args.impl, args.certificate, passthrough)
    if passthrough:
        _parser().error("arguments after `--` are only for `certify`")
    if getattr(args, "handler", None) is not None:
        return args.handler(args)

    from oracles import golden_manifest

    from . import golden, observations

    if args.action == "generate":
        path = golden.generate_into(args.dir, args.impl)
        print(f"wrote {len(golden.CASES)} cases and {path}")
        return 0
    if args.action == "check":
        problems = golden_manifest.check(args.dir)
    else:
        problems = golden.compare_with_goldens(args.impl, args.dir or golden.GOLDEN_DIR)
        for note in observations.drain()["notes"]:
            print(f"note: {note}")
    for line in problems:
        print(line)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
